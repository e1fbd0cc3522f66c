"""AdamW with weight-decay groups, and the learning-rate schedules (warmup + cosine, WSD).

Weight decay applies to matrices (projections, and the embedding unless `decay_embeddings` is
off) and never to vectors: norm weights, biases, per-head decays and gates (A_log, dt_bias, …)
and conv taps kept as `[C, 1, W]` count as matrices only through their ndim, so the rule is
"ndim ≥ 2", the usual GPT split (nanoGPT `configure_optimizers`).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class OptimConfig(BaseModel):
    """AdamW and gradient clipping."""

    model_config = STRICT

    lr: float = Field(default=3e-4, gt=0)
    """Peak learning rate (after warmup)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's β1, β2."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW's ε."""
    weight_decay: float = Field(default=0.1, ge=0)
    """Decoupled weight decay of the matrices (not of norms, biases, gates or decays)."""
    decay_embeddings: bool = True
    """Whether the embedding (and an untied LM head) takes weight decay."""
    grad_clip: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this value; None: no clipping (the norm is still logged)."""

    @model_validator(mode="after")
    def _betas_in_range(self) -> OptimConfig:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {self.betas}")
        return self


class SchedulerConfig(BaseModel):
    """Learning-rate schedule over `training.steps`."""

    model_config = STRICT

    kind: Literal["cosine", "wsd", "constant"] = "cosine"
    """cosine: warmup then cosine to `min_lr_ratio`; wsd: warmup, stable, then a decay over the last
    `decay_fraction` of the steps; constant: warmup then flat."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warmup from 0 over these many steps."""
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    """Final learning rate as a share of `optimizer.lr`."""
    decay_fraction: float = Field(default=0.2, gt=0, le=1)
    """wsd: share of the steps spent decaying."""
    decay_shape: Literal["linear", "cosine", "sqrt"] = "linear"
    """wsd: the decay's shape (1 − sqrt is MiniCPM's)."""


def lr_factor(step: int, steps: int, cfg: SchedulerConfig) -> float:
    """Multiplier of the peak learning rate for optimizer step `step` (0-based) of `steps`."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    floor = cfg.min_lr_ratio
    if cfg.kind == "constant":
        return 1.0
    if cfg.kind == "cosine":
        span = max(1, steps - cfg.warmup_steps)
        done = min(1.0, (step - cfg.warmup_steps) / span)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))
    start = steps - max(1, round(cfg.decay_fraction * steps))
    if step < max(start, cfg.warmup_steps):
        return 1.0
    done = min(1.0, (step - start + 1) / max(1, steps - start))
    shape = {"linear": done, "sqrt": math.sqrt(done), "cosine": 0.5 * (1 - math.cos(math.pi * done))}
    return 1.0 - (1 - floor) * shape[cfg.decay_shape]


def param_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """Two AdamW groups: decayed matrices, and everything else with weight_decay 0."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, rest, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = id(p) in embeddings or name.endswith("lm_head.weight")
        if p.dim() >= 2 and (cfg.decay_embeddings or not is_embedding):
            decay.append(p)
        else:
            rest.append(p)
    return [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimConfig, capturable: bool = False) -> torch.optim.AdamW:
    """AdamW over `param_groups`; `capturable` keeps its step count on the device and reads the
    learning rate there (a CUDA graph replays its update, `train/graph.py`)."""
    groups = param_groups(model, cfg)
    if not any(g["params"] for g in groups):
        raise ValueError("nothing to train: every parameter of the model is frozen (model.freeze)")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, capturable=capturable)


def tensor_lrs(opt: torch.optim.Optimizer, device: torch.device) -> list[torch.Tensor]:
    """One learning-rate scalar per group for `hold_lrs`: fp32 on CUDA (what the capturable update
    reads), float64 elsewhere (the CPU's update reads it back as the very float the scheduler
    computed, so the run equals one with float learning rates bit for bit)."""
    dtype = torch.float32 if device.type == "cuda" else torch.float64
    return [torch.zeros((), dtype=dtype, device=device) for _ in opt.param_groups]


def hold_lrs(opt: torch.optim.Optimizer, lrs: list[torch.Tensor] | None) -> None:
    """Each group's learning rate in `lrs` (filled in place, so a captured update reads the
    scheduler's value), or a float when None. A scheduler that assigns a float lr is brought back
    by calling it after the scheduler's step."""
    for i, group in enumerate(opt.param_groups):
        lr = group["lr"]
        if lrs is None:
            group["lr"] = float(lr)
        elif lr is not lrs[i]:
            lrs[i].fill_(float(lr))
            group["lr"] = lrs[i]


def update_mode(opt: torch.optim.Optimizer, lrs: list[torch.Tensor] | None, capturable: bool) -> None:
    """`opt` in this run's update mode (`hold_lrs`, and `capturable` with the step counts on the
    device, or on the host without it), whatever mode a loaded checkpoint's groups and state
    were saved in."""
    hold_lrs(opt, lrs)
    for group in opt.param_groups:
        group["capturable"] = capturable
        for p in group["params"]:
            state = opt.state.get(p, {})
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].to(p.device if capturable else "cpu", torch.float32)


def build_scheduler(
    opt: torch.optim.Optimizer, steps: int, cfg: SchedulerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """Step k of the optimizer runs at `lr · lr_factor(k)` (the scheduler steps after it)."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, cfg))
