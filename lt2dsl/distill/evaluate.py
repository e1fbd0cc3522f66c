"""Held-out figures of a distillation run: next-token loss (perplexity) and KL to the teacher.

Both are means per labelled token over the same fixed held-out rows (`eval_batches` of the run's
validation split), computed from final hidden states with the chunked losses, so the logits never
exist whole.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
from torch import nn

from lt2dsl.distill.kl import linear_kd_loss
from lt2dsl.train.loader import IGNORE, Batch
from lt2dsl.train.loss import linear_cross_entropy
from lt2dsl.train.parallel import TrainModel

CHUNK = 4096


def heldout_batches(train_cfg, rows: int, vocab: int) -> list[Batch]:
    """`rows` fixed held-out rows of a trainer config's data (its validation split), for models of
    `vocab` tokens.

    Raises:
        ValueError: the data has no held-out split (`data.val` empty and `val_fraction = 0`).
    """
    val = validation(train_cfg, vocab)
    if val is None:
        raise ValueError("data: held-out figures need a validation split (`data.val` or `val_fraction`)")
    return val.eval_batches(rows)


def validation(train_cfg, vocab: int):
    """The validation loader of a trainer config's data (None: it has no held-out split)."""
    from lt2dsl.train.build import build_data, shard_of

    return build_data(train_cfg, shard_of(train_cfg, 1, 0), vocab, True, lambda: None).val


def _tm(model: nn.Module) -> TrainModel:
    return model if isinstance(model, TrainModel) else TrainModel(model)


@torch.no_grad()
def _mean(per_batch: Callable[[Batch], torch.Tensor], batches: list[Batch], device) -> float:
    total, count = 0.0, 0
    for b in batches:
        b = b.to(device)
        total += float(per_batch(b))
        count += int((b.labels != IGNORE).sum())
    return total / max(count, 1)


def lm_loss(model: nn.Module, batches: list[Batch]) -> float:
    """Mean next-token loss (nats per labelled token) of `model` (an `LT2Model` or `TrainModel`)."""
    tm = _tm(model)
    was, device = tm.training, next(tm.parameters()).device
    tm.eval()
    try:
        return _mean(lambda b: ce_sum(tm, b), batches, device)
    finally:
        tm.train(was)


def kl_to_teacher(teacher: nn.Module, student: nn.Module, batches: list[Batch]) -> float:
    """Mean KL(teacher ‖ student) of the next-token distributions, nats per labelled token."""
    t, s = _tm(teacher), _tm(student)
    was, device = s.training, next(s.parameters()).device
    t.eval(), s.eval()
    try:
        return _mean(lambda b: kl_sum(t, s, b), batches, device)
    finally:
        s.train(was)


def ce_sum(tm: TrainModel, b: Batch) -> torch.Tensor:
    """Σ over the labelled tokens of `b` of the next-token loss."""
    return linear_cross_entropy(tm(b.input_ids, None, b.cu_seqlens), tm.head_weight(), b.labels, CHUNK)


def kl_sum(t: TrainModel, s: TrainModel, b: Batch) -> torch.Tensor:
    """Σ over the labelled tokens of `b` of KL(teacher ‖ student)."""
    ht, hs = t(b.input_ids, None, b.cu_seqlens), s(b.input_ids, None, b.cu_seqlens)
    return linear_kd_loss(hs, s.head_weight(), ht, t.head_weight(), b.labels, ce_weight=0.0, chunk=CHUNK)


def objective_loss(loss_module: nn.Module, batches: list[Batch], device, bf16: bool = False) -> float:
    """Mean per labelled token of a trainer loss module (`Objective.loss_module`: summed over the
    labelled tokens) over `batches`, as the trainer's own held-out evaluation computes it."""
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with ctx:
        return _mean(lambda b: loss_module(b.input_ids, b.labels, b.cu_seqlens), batches, device)


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))
