"""`TaskSource`: what a trainer draws batches from (`lt2dsl.tasks.build(cfg)` returns one).

    source = build({"task": "mqar", "num_kv_pairs": 8})
    ids, labels = source.batch(step, batch_size, seed)   # LongTensor [B, T] each, -100: no loss

A batch is a pure function of `(seed, step, split)` and, for a curriculum task, of the stage, so
resuming a run needs only the step and `state_dict()`. A curriculum advances only when the trainer
reports accuracy: `observe(step, right, answers)` after each training step, with the counts of the
batch's answers predicted right and of all its answers (`lt2dsl.train` counts them from the
hidden states at the labelled positions only). `observes` says whether a source needs it (a
curriculum, or a task with a `threshold`); `observe` is a no-op for the others, so a trainer may
always call it. `solved` says when the reports reached the task's threshold (a curriculum: at
its last stage); the experiment runner ends a training there.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from lt2dsl.tasks.base import TaskConfig, TaskData, check_batch_size, seed_entropy

if TYPE_CHECKING:
    import torch


class TaskSource:
    """Batches of one task config (see the module docstring).

    Attributes:
        cfg: the task config.
        vocab_size: ids of inputs and labels lie in `[0, vocab_size)`.
        seq_len: the longest row (a curriculum's last stage).
        curriculum: the length curriculum, or None.
    """

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg
        self.vocab_size, self.seq_len = cfg.vocab_size, cfg.seq_len
        self.curriculum = cfg.curriculum()
        # a task without a curriculum but with a threshold: the reports that judge it solved
        until = self.curriculum is None and cfg.threshold is not None
        self.reports: deque[float] | None = deque(maxlen=cfg.window) if until else None
        self._solved = False

    def current(self) -> TaskConfig:
        """The config batches come from now (the curriculum's stage, if any)."""
        if self.curriculum is None:
            return self.cfg
        return self.cfg.at_stage(self.curriculum.stage)

    def sample(self, step: int, batch_size: int, seed: int = 0, split: str = "train") -> TaskData:
        """Batch `step` as numpy arrays with its slices (what evaluation reads)."""
        check_batch_size(batch_size)
        return self.current().generate(batch_size, seed_entropy(seed, step, split))

    def batch(
        self, step: int, batch_size: int, seed: int = 0, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, labels): LongTensors `[B, T]` on the CPU, labels -100 where no loss."""
        import torch

        data = self.sample(step, batch_size, seed, split)
        return torch.from_numpy(data.inputs), torch.from_numpy(data.labels)

    @property
    def observes(self) -> bool:
        """Whether `observe` does anything (a curriculum or a threshold): a trainer counts right
        answers only then."""
        return self.curriculum is not None or self.reports is not None

    @property
    def solved(self) -> bool:
        """The reports reached the threshold (a curriculum: at its last stage)."""
        return self.curriculum.solved if self.curriculum is not None else self._solved

    def observe(self, step: int, right: int, answers: int) -> float:
        """Report a training batch's exact match to the curriculum; returns the accuracy.

        Args:
            step: the step the batch came from.
            right: the batch's answers (labels != -100) whose argmax prediction equals the label.
            answers: the batch's answers (accuracy 1.0 when there are none).
        """
        for name, v in (("right", right), ("answers", answers)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if right > answers:
            raise ValueError(f"right ({right}) cannot exceed answers ({answers})")
        acc = right / answers if answers else 1.0
        if self.curriculum is not None:
            self.curriculum.update(step, acc)
        elif self.reports is not None and not self._solved:
            self.reports.append(acc)
            full = len(self.reports) == self.reports.maxlen
            self._solved = full and sum(self.reports) / len(self.reports) >= self.cfg.threshold
        return acc

    def state_dict(self) -> dict:
        """What a checkpoint saves to resume this source exactly (the curriculum's or the
        threshold's reports)."""
        if self.curriculum is not None:
            return {"curriculum": self.curriculum.state_dict()}
        if self.reports is not None:
            return {"until": {"reports": list(self.reports), "solved": self._solved}}
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`'s output (ValueError when it is not one)."""
        if self.curriculum is not None and "curriculum" in state:
            self.curriculum.load_state_dict(state["curriculum"])
        if self.reports is not None and "until" in state:
            try:
                reports = [float(a) for a in state["until"]["reports"]]
                solved = bool(state["until"]["solved"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"not a threshold state (reports, solved): {e}") from None
            self.reports.clear()
            self.reports.extend(reports)
            self._solved = solved
