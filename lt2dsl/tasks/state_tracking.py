"""State tracking: the running product of a sequence of group elements (the word problem).

Groups are permutation groups: `parity` (S2, i.e. Z2), `s3` (S3, 6 elements) and `s5` (S5, 120
elements, not solvable: no constant-depth circuit of the solvable kind computes its products).
Element ids index the permutations of `range(m)` in lexicographic order (0 is the identity).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from lt2dsl.tasks.base import IGNORE, TaskConfig, TaskData, check_batch_size, require, with_positions
from lt2dsl.tasks.curriculum import MAX_STAGE, MIN_STAGE, Curriculum, stage_length

DEGREE = {"parity": 2, "s3": 3, "s5": 5}


@functools.cache
def multiplication_table(group: str) -> np.ndarray:
    """`[|G|, |G|]` int64: entry (a, b) is the id of "a, then b" ((a·b)[i] = b[a[i]])."""
    perms = list(itertools.permutations(range(DEGREE[group])))
    index = {p: i for i, p in enumerate(perms)}
    table = [[index[tuple(b[a[i]] for i in range(len(a)))] for b in perms] for a in perms]
    return np.asarray(table, dtype=np.int64)


def state_tracking(
    *,
    batch_size: int,
    seed: int | Sequence[int],
    group: str = "s5",
    length: int = 64,
    answers: str = "all",
) -> TaskData:
    """Sequences of uniformly random group elements g_1 … g_n, labelled with their running
    products p_t = g_1 · g_2 ⋯ g_t (every position with `answers="all"`, the last one with
    `answers="last"`). Inputs and labels share the ids `[0, |G|)`.

    Example (parity: 1 flips the running parity):

    >>> print(state_tracking(batch_size=1, seed=0, group="parity", length=12).show())
    Inputs: 1 1 1 0 0 0 0 0 0 1 1 1
    Labels: 1 0 1 1 1 1 1 1 1 0 1 0

    and S3 (ids of (0,1,2), (0,2,1), (1,0,2), (1,2,0), (2,0,1), (2,1,0); 0 is the identity), where
    2 then 3 is (1,0,2) then (1,2,0) = (2,1,0), id 5:

    >>> print(state_tracking(batch_size=1, seed=1, group="s3", length=8).show())
    Inputs: 2 3 4 5 0 0 4 5
    Labels: 2 5 2 3 3 3 0 5

    Slices: `position` (power-of-two buckets of t).
    """
    check_batch_size(batch_size)
    require(group in DEGREE, f"group must be one of {', '.join(DEGREE)}, got {group!r}")
    require(length >= 1, f"length must be >= 1, got {length}")
    require(answers in ("all", "last"), f"answers must be 'all' or 'last', got {answers!r}")
    table = multiplication_table(group)
    rng = np.random.default_rng(seed)
    g = rng.integers(0, table.shape[0], size=(batch_size, length), dtype=np.int64)
    prefix = np.empty_like(g)
    prefix[:, 0] = g[:, 0]
    for t in range(1, length):
        prefix[:, t] = table[prefix[:, t - 1], g[:, t]]
    labels = prefix if answers == "all" else np.where(np.arange(length) == length - 1, prefix, IGNORE)
    return with_positions(TaskData(g, labels))


class StateTrackingConfig(TaskConfig):
    """`data = { task = "state_tracking", group = "s5" }`: the curriculum over n = 2^(stage+2)
    from `stage` to `max_stage`, or a fixed `length` (no curriculum)."""

    task: Literal["state_tracking"] = "state_tracking"
    group: Literal["parity", "s3", "s5"] = "s5"
    length: int | None = Field(None, ge=1, description="fixed n; unset: the curriculum sets n")
    stage: int = Field(1, ge=MIN_STAGE, le=MAX_STAGE, description="first curriculum stage (n = 2^(stage+2))")
    max_stage: int = Field(5, ge=MIN_STAGE, le=MAX_STAGE, description="last curriculum stage")
    threshold: float = Field(0.99, gt=0, le=1, description="accuracy that solves a stage (or the fixed n)")
    window: int = Field(10, ge=1, description="training batches averaged against the threshold")
    answers: Literal["all", "last"] = "all"
    description: ClassVar[str] = "running product of S5 / S3 / parity elements, with a length curriculum"
    generator: ClassVar = staticmethod(state_tracking)

    @model_validator(mode="after")
    def _stages_in_order(self):
        require(self.max_stage >= self.stage, f"max_stage ({self.max_stage}) < stage ({self.stage})")
        return self

    def generatable(self) -> bool:
        return self.length is not None

    def generator_args(self) -> dict[str, Any]:
        require(self.length is not None, "a curriculum config has no fixed length: use at_stage(k)")
        return {"group": self.group, "length": self.length, "answers": self.answers}

    @property
    def vocab_size(self) -> int:
        return multiplication_table(self.group).shape[0]

    @property
    def seq_len(self) -> int:
        return self.length if self.length is not None else stage_length(self.max_stage)

    def curriculum(self) -> Curriculum | None:
        if self.length is not None:
            return None
        return Curriculum(self.stage, self.max_stage, self.threshold, self.window)

    def at_stage(self, stage: int) -> StateTrackingConfig:
        """The fixed-length config of curriculum stage `stage`."""
        return self.model_copy(update={"length": stage_length(stage)})

    def eval_variants(self) -> dict[str, TaskConfig]:
        if self.length is not None:
            return {f"n={self.length}": self}
        first = min(self.stage, 1)  # stage 1 on, and the stages below it the curriculum starts from
        return {
            f"stage {k} (n={stage_length(k)})": self.at_stage(k) for k in range(first, self.max_stage + 1)
        }
