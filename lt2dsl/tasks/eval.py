"""Exact-match evaluation on a task's test split, overall and by slice.

An answer is right when the argmax of the model's logits at its position equals the label; a row
is right when all its answers are. Accuracy is reported for each evaluation variant (a curriculum
task: each stage's length), over all answers and for each slice bucket (`position`, and the
task's own: MQAR `distance`, NIAH `depth`). Batches come from the test split's seeds, disjoint
from every training seed (`lt2dsl.tasks.base.seed_entropy`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lt2dsl.tasks import parse_config
from lt2dsl.tasks.base import TaskConfig, TaskData
from lt2dsl.tasks.source import TaskSource


@dataclass
class Tally:
    """Right / total answers and rows."""

    right: int = 0
    total: int = 0
    rows_right: int = 0
    rows: int = 0

    @property
    def accuracy(self) -> float:
        return self.right / self.total if self.total else float("nan")

    @property
    def sequence_accuracy(self) -> float:
        return self.rows_right / self.rows if self.rows else float("nan")


@dataclass
class VariantResult:
    """One evaluation variant: the overall tally and slice → bucket label → tally."""

    overall: Tally = field(default_factory=Tally)
    slices: dict[str, dict[str, Tally]] = field(default_factory=lambda: defaultdict(dict))


@dataclass
class EvalReport:
    """What `evaluate` measured. `variants` keeps the config's order (a curriculum: stage 1 first)."""

    task: str
    config: dict[str, Any]
    variants: dict[str, VariantResult]
    batches: int
    batch_size: int
    seed: int

    @property
    def accuracy(self) -> float:
        """Answers right over all variants."""
        right = sum(v.overall.right for v in self.variants.values())
        total = sum(v.overall.total for v in self.variants.values())
        return right / total if total else float("nan")

    def stage_solved(self, threshold: float) -> int:
        """The number of leading variants (curriculum stages) whose accuracy reaches `threshold`."""
        k = 0
        for v in self.variants.values():
            if not v.overall.accuracy >= threshold:
                break
            k += 1
        return k

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "config": self.config,
            "batches": self.batches,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "accuracy": self.accuracy,
            "variants": {name: _variant_json(v) for name, v in self.variants.items()},
        }


def _variant_json(v: VariantResult) -> dict[str, Any]:
    return {
        "accuracy": v.overall.accuracy,
        "sequence_accuracy": v.overall.sequence_accuracy,
        "answers": v.overall.total,
        "rows": v.overall.rows,
        "slices": {
            s: {b: {"accuracy": t.accuracy, "answers": t.total} for b, t in buckets.items()}
            for s, buckets in v.slices.items()
        },
    }


def evaluate(
    model: torch.nn.Module,
    cfg: dict[str, Any] | TaskConfig,
    *,
    batches: int = 4,
    batch_size: int = 32,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> EvalReport:
    """Score `model` (an `LT2Model`: ids `[B, T]` → logits `[B, T, vocab]`) on the task `cfg`.

    Args:
        model: the model; run in eval mode under `torch.no_grad`, its train/eval mode restored.
        cfg: a task config or its `data = {...}` dict.
        batches: test batches per variant. batch_size: rows per batch.
        seed: the run seed whose test stream is used (in [0, 2^31)).
        device: where the inputs go; default the model's parameters' device.
        progress: show a rich progress bar (on stderr).

    Raises:
        ValueError: a bad argument, or a model whose vocabulary or `max_len` the task does not fit.
    """
    task = parse_config(cfg)
    for name, value in (("batches", batches), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    check_model_fits(model, task)
    if device is None:
        device = next(model.parameters()).device
    variants = task.eval_variants()
    results: dict[str, VariantResult] = {}
    was_training = model.training
    model.eval()
    try:
        with _progress(progress, len(variants) * batches) as advance, torch.no_grad():
            for name, variant in variants.items():
                source, res = TaskSource(variant), VariantResult()
                for step in range(batches):
                    data = source.sample(step, batch_size, seed, split="test")
                    logits = model(torch.from_numpy(data.inputs).to(device))
                    tally(res, data, logits.argmax(-1).cpu().numpy())
                    advance()
                results[name] = res
    finally:
        model.train(was_training)
    return EvalReport(task.task, task.model_dump(), results, batches, batch_size, seed)


def check_model_fits(model: torch.nn.Module, task: TaskConfig) -> None:
    """ValueError when the model's vocabulary or longest sequence is smaller than the task needs."""
    cfg = getattr(model, "config", None)
    vocab = getattr(cfg, "vocab", None)
    if vocab is not None and vocab < task.vocab_size:
        raise ValueError(f"the model's vocab ({vocab}) is smaller than the task's ({task.vocab_size})")
    if cfg is not None and not getattr(cfg, "head", True):
        raise ValueError("the model has `head = none`: evaluation needs logits")
    max_len = getattr(model, "max_len", None)
    if max_len is not None and max_len < task.seq_len:
        raise ValueError(f"the task's rows have {task.seq_len} tokens but the model's max_len is {max_len}")


def tally(res: VariantResult, data: TaskData, pred: np.ndarray) -> None:
    """Add one batch's answers (`pred [B, T]`) to `res`, overall and per slice bucket."""
    mask = data.answers
    right = (pred == data.labels) & mask
    res.overall.right += int(right.sum())
    res.overall.total += int(mask.sum())
    has = mask.any(axis=1)
    res.overall.rows += int(has.sum())
    res.overall.rows_right += int((has & (right.sum(axis=1) == mask.sum(axis=1))).sum())
    for name, ids in data.slices.items():
        labels = data.names.get(name, {})
        r = np.bincount(ids[mask], weights=right[mask])
        t = np.bincount(ids[mask])
        for b in np.flatnonzero(t):
            key = labels.get(int(b), str(int(b)))
            got = res.slices[name].setdefault(key, Tally())
            got.right += int(r[b])
            got.total += int(t[b])


class _progress:
    """A rich progress bar over `total` batches (or nothing); the context value advances it."""

    def __init__(self, show: bool, total: int):
        self.show, self.total, self.bar = show, total, None

    def __enter__(self):
        if not self.show:
            return lambda: None
        from rich.console import Console
        from rich.progress import Progress

        self.bar = Progress(transient=True, console=Console(stderr=True))
        self.bar.__enter__()
        task = self.bar.add_task("evaluating", total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False
