"""What every synthetic task shares: the data type, the seeding, the config base, the rendering.

A task is a pydantic config (one file per task) whose `generate(batch_size, seed)` calls a pure
numpy generator and returns `TaskData`: `inputs [B, T]`, `labels [B, T]` (`IGNORE` = -100 wherever
there is no loss, so only the answers are scored) and `slices`, per-token bucket ids `[B, T]` that
evaluation groups the accuracy by (meaningful where `labels != IGNORE`).

Seeds: a batch is a pure function of `(seed, step, split)`. Training seeds live in
`[0, 2^31)`; the test split adds `2^31`, so train and test streams never share a seed
(zoology's `prepare_data` convention).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lt2dsl.tasks.curriculum import Curriculum

IGNORE = -100
SEED_SPAN = 2**31
SPLITS = ("train", "test")


@dataclass
class TaskData:
    """One batch of a task.

    Attributes:
        inputs: `[B, T]` int64 token ids.
        labels: `[B, T]` int64 targets, `IGNORE` where no loss is taken.
        slices: name → `[B, T]` int64 bucket ids of each answer (read where labels != IGNORE).
        names: name → {bucket id: label} for the slices whose ids are not their own label.
    """

    inputs: np.ndarray
    labels: np.ndarray
    slices: dict[str, np.ndarray] = field(default_factory=dict)
    names: dict[str, dict[int, str]] = field(default_factory=dict)

    @property
    def answers(self) -> np.ndarray:
        """`[B, T]` bool: where a label is scored."""
        return self.labels != IGNORE

    def show(self, row: int = 0) -> str:
        """One row as aligned `Inputs:` / `Labels:` lines, `-` where the label is `IGNORE`."""
        ins = [str(int(t)) for t in self.inputs[row]]
        labs = ["-" if t == IGNORE else str(int(t)) for t in self.labels[row]]
        w = max(len(s) for s in ins + labs)
        return "\n".join(
            [
                "Inputs: " + " ".join(s.rjust(w) for s in ins),
                "Labels: " + " ".join(s.rjust(w) for s in labs),
            ]
        )


def seed_entropy(seed: int, step: int, split: str = "train") -> list[int]:
    """The numpy seed-sequence entropy of batch `step` of run `seed` in `split`.

    Raises:
        ValueError: seed outside [0, 2^31), a negative step or an unknown split.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < SEED_SPAN:
        raise ValueError(f"seed must be an integer in [0, 2^31), got {seed!r}")
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return [int(seed) + (SEED_SPAN if split == "test" else 0), int(step)]


def pow2_buckets(values: np.ndarray) -> tuple[np.ndarray, dict[int, str]]:
    """Non-negative ints bucketed by powers of two (`0-7`, `8-15`, `16-31`, …): (ids, id → label)."""
    ids = np.maximum(np.floor(np.log2(np.maximum(values, 1))).astype(np.int64) - 2, 0)
    names = {}
    for b in np.unique(ids):
        lo, hi = (0, 7) if b == 0 else (2 ** (b + 2), 2 ** (b + 3) - 1)
        names[int(b)] = f"{lo}-{hi}"
    return ids, names


def with_positions(data: TaskData) -> TaskData:
    """Add the `position` slice (absolute position bucket of each answer)."""
    B, T = data.inputs.shape
    ids, data.names["position"] = pow2_buckets(np.arange(T))
    data.slices["position"] = np.broadcast_to(ids, (B, T)).copy()
    return data


def require(ok: bool, message: str) -> None:
    """A generator's precondition: ValueError with `message` when it does not hold."""
    if not ok:
        raise ValueError(message)


class TaskConfig(BaseModel):
    """Base of every task config: frozen, closed (unknown keys are errors), `task` names it.

    A subclass names its numpy `generator`, whose keyword arguments are the config's fields but
    the training controls (`CONTROLS`), and its `seq_len`; a config is validated by generating
    one row, so the generator's preconditions are the config's.

    `threshold` / `window`: the task is solved once the mean exact match of the last `window`
    training batches reaches `threshold` (a curriculum: its stage is, and it moves on); unset,
    it never is. The experiment runner ends a training once its task is solved.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    CONTROLS: ClassVar[frozenset[str]] = frozenset({"task", "threshold", "window"})
    task: str
    threshold: float | None = Field(None, gt=0, le=1, description="training accuracy that solves the task")
    window: int = Field(10, ge=1, description="training batches averaged against the threshold")
    description: ClassVar[str] = ""
    generator: ClassVar[Callable[..., TaskData]]

    @model_validator(mode="after")
    def _generates(self):
        if self.generatable():
            self.generate(1, 0)
        return self

    def generatable(self) -> bool:
        """Whether `generate` applies to this config as it stands (a curriculum: per stage)."""
        return True

    def generator_args(self) -> dict[str, Any]:
        return self.model_dump(exclude=set(self.CONTROLS))

    def curriculum(self) -> Curriculum | None:
        """A fresh length curriculum when the config trains on one (state tracking without a
        fixed length); then `at_stage(k)` gives stage k's fixed-length config."""
        return None

    @property
    def vocab_size(self) -> int:
        """Token ids (inputs and labels) lie in `[0, vocab_size)`."""
        return self.vocab

    @property
    def seq_len(self) -> int:
        """The longest row `generate` returns."""
        raise NotImplementedError

    def generate(self, batch_size: int, seed: int | Sequence[int]) -> TaskData:
        """`batch_size` rows from the generator seeded with `seed` (an int or an entropy list)."""
        return type(self).generator(batch_size=batch_size, seed=seed, **self.generator_args())

    def eval_variants(self) -> dict[str, TaskConfig]:
        """The configs evaluation scores separately (a curriculum: one per stage)."""
        return {"": self}


def show(data: TaskData, row: int = 0) -> str:
    """`data.show(row)`: one row as aligned `Inputs:` / `Labels:` lines."""
    return data.show(row)


def check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def distinct_draws(rng: np.random.Generator, B: int, n: int, k: int) -> np.ndarray:
    """`[B, k]` ints: per row, k distinct values drawn uniformly from `[0, n)` (k ≤ n)."""
    return np.argsort(rng.random((B, n)), axis=1)[:, :k]


def weighted_draws(rng: np.random.Generator, weights: np.ndarray, B: int, k: int) -> np.ndarray:
    """`[B, k]` ints: per row, k distinct indices of `weights [n]`, sampled successively without
    replacement with probabilities ∝ weights (the Gumbel-top-k trick), in draw order."""
    scores = np.log(weights)[None, :] + rng.gumbel(size=(B, weights.size))
    return np.argsort(-scores, axis=1)[:, :k]
