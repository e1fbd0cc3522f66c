"""A length curriculum: stage k trains on sequences of n = 2^(k+2) tokens (stage 4 = 64, 5 = 128).

Stages below 1 (0: n = 4, −1: n = 2) keep the formula, so a curriculum that starts shorter than
the research's first stage reports the same stage numbers for the same n.

The trainer reports the exact-match accuracy of each training batch (`update`); once the mean of
the last `window` reports reaches `threshold`, the curriculum moves to the next stage (the reports
start over). At the last stage it marks itself `solved` instead. Its whole state is a small dict
(`state_dict` / `load_state_dict`), saved with a checkpoint so a resumed run continues at the
same stage with the same reports.
"""

from __future__ import annotations

from collections import deque

MIN_STAGE = -1  # n = 2: one product, the group's multiplication table
MAX_STAGE = 14  # n = 65536


def stage_length(stage: int) -> int:
    """n of curriculum stage k: 2^(k+2)."""
    if isinstance(stage, bool) or not isinstance(stage, int) or not MIN_STAGE <= stage <= MAX_STAGE:
        raise ValueError(f"a curriculum stage is an integer in [{MIN_STAGE}, {MAX_STAGE}], got {stage!r}")
    return 2 ** (stage + 2)


class Curriculum:
    """Stages `start..last`, advanced on `threshold` accuracy averaged over `window` reports.

    Attributes:
        stage: the stage being trained.
        solved: the last stage reached the threshold.
        reached: stage → the step at which training on it began.
    """

    def __init__(self, start: int, last: int, threshold: float, window: int):
        stage_length(start), stage_length(last)
        if last < start:
            raise ValueError(f"the last stage ({last}) comes before the first ({start})")
        self.start, self.last, self.threshold, self.window = start, last, threshold, window
        self.stage, self.solved = start, False
        self.reports: deque[float] = deque(maxlen=window)
        self.reached: dict[int, int] = {start: 0}

    @property
    def length(self) -> int:
        return stage_length(self.stage)

    @property
    def highest_solved(self) -> int:
        """The last stage whose threshold was reached (start − 1 when none was)."""
        return self.stage if self.solved else self.stage - 1

    def update(self, step: int, accuracy: float) -> bool:
        """Record one batch's accuracy; True when this report moved the curriculum on."""
        if self.solved:
            return False
        self.reports.append(float(accuracy))
        if len(self.reports) < self.window or sum(self.reports) / self.window < self.threshold:
            return False
        self.reports.clear()
        if self.stage == self.last:
            self.solved = True
        else:
            self.stage += 1
            self.reached[self.stage] = step + 1
        return True

    def state_dict(self) -> dict:
        return {
            "stage": self.stage,
            "solved": self.solved,
            "reports": list(self.reports),
            "reached": {str(k): v for k, v in self.reached.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`'s output (ValueError when it does not fit these stages)."""
        try:
            stage, solved = int(state["stage"]), bool(state["solved"])
            reports = [float(a) for a in state["reports"]]
            reached = {int(k): int(v) for k, v in state["reached"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not a curriculum state (stage, solved, reports, reached): {e}") from None
        if not self.start <= stage <= self.last:
            raise ValueError(f"curriculum state at stage {stage}, outside stages {self.start}..{self.last}")
        self.stage, self.solved, self.reached = stage, solved, reached
        self.reports = deque(reports[-self.window :], maxlen=self.window)
