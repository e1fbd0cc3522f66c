"""The smallest training loop over a task source: what the experiments and the learning test run.

AdamW (weight decay on matrices only), linear warm-up then cosine decay, gradient clipping,
cross-entropy on the answers (labels -100 elsewhere), the curriculum fed each batch's accuracy.
It stands in for `lt2dsl train` (its own room) until that trainer takes task sources; nothing
here is specific to a task.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from lt2dsl.tasks.base import IGNORE
from lt2dsl.tasks.source import TaskSource


class OptimConfig(BaseModel):
    """`[optimizer]`: AdamW with warm-up and cosine decay."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.1, ge=0, description="on weight matrices only")
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = Field(100, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr / lr of the cosine decay")
    grad_clip: float = Field(1.0, gt=0)


def lr_at(step: int, steps: int, opt: OptimConfig) -> float:
    """Linear warm-up over `warmup_steps`, then cosine from lr to min_lr_ratio · lr at `steps`."""
    if step < opt.warmup_steps:
        return opt.lr * (step + 1) / opt.warmup_steps
    span = max(1, steps - opt.warmup_steps)
    frac = min(1.0, (step - opt.warmup_steps) / span)
    return opt.lr * (opt.min_lr_ratio + (1 - opt.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: torch.nn.Module, opt: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; decay on those with two or more dims."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    groups = [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": opt.weight_decay},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=opt.lr, betas=opt.betas)


def train(
    model: torch.nn.Module,
    source: TaskSource,
    *,
    steps: int,
    batch_size: int,
    seed: int = 0,
    optim: OptimConfig | None = None,
    log_every: int = 50,
    on_log: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train `model` for `steps` steps on `source`'s training stream of run `seed`.

    Stops early once a curriculum is solved. Returns one dict per logged step: `step`, `loss`,
    `accuracy` (the batch's exact match), `lr` and, with a curriculum, `stage`.
    """
    optim = optim or OptimConfig()
    opt = make_optimizer(model, optim)
    device = next(model.parameters()).device
    history: list[dict[str, Any]] = []
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, optim)
        ids, labels = source.batch(step, batch_size, seed)
        ids, labels = ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        logits = model(ids)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], optim.grad_clip)
        opt.step()
        acc = source.observe(step, logits, labels)
        cur = source.curriculum
        done = cur is not None and cur.solved
        if step % log_every == 0 or step == steps - 1 or done:
            row = {"step": step, "loss": loss.item(), "accuracy": acc, "lr": opt.param_groups[0]["lr"]}
            if cur is not None:
                row["stage"] = cur.stage
            history.append(row)
            if on_log is not None:
                on_log(row)
        if done:
            break
    return history


def freeze(model: torch.nn.Module, patterns: list[str]) -> list[str]:
    """Stop the gradient of every parameter whose name matches one of the glob `patterns`.

    Returns the frozen names; ValueError when a pattern matches nothing (a typo would silently
    leave the model trainable).
    """
    from fnmatch import fnmatchcase

    frozen = []
    for pat in patterns:
        hits = [n for n, _ in model.named_parameters() if fnmatchcase(n, pat)]
        if not hits:
            raise ValueError(f"freeze pattern {pat!r} matches no parameter of the model")
        frozen += hits
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    return sorted(set(frozen))
