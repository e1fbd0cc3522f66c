"""Reference of the decode GEMV: the unfused chain it replaces, float64-capable.

`gemv_ref` runs exactly the ops of the graph without the fusion (`F.rms_norm`, `F.linear`, the
SwiGLU's `silu(g) · u`, the residual add), each rounding to the input dtype as they do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lt2dsl.kernels.fused.naive import gated_rmsnorm_ref, norm_add_rmsnorm_ref


def gemv_ref(
    x: Tensor,
    weight: Tensor,
    *,
    norm_weight: Tensor | None = None,
    eps: float | None = None,
    residual: Tensor | None = None,
    up: int | None = None,
    width: int | None = None,
    gate: Tensor | None = None,
    group: int | None = None,
) -> Tensor:
    """`[..., K]` → `[..., N]`: y = f(x) @ Wᵀ with f = RMSNorm · γ when `norm_weight` is given (with
    `gate`: fla's gated RMSNorm over groups of `group` channels, · silu(gate)); then
    silu(y[..., :width]) · y[..., up : up + width] when `up` is given, or residual + y."""
    h = F.rms_norm(x, (x.shape[-1],), norm_weight, eps) if norm_weight is not None and gate is None else x
    if gate is not None:
        heads = (-1, norm_weight.shape[0])  # o's heads of len(γ) channels, flattened into K
        o, z = x.unflatten(-1, heads), gate.unflatten(-1, heads)
        h = gated_rmsnorm_ref(o, z, norm_weight, eps, "silu", group).flatten(-2)
    y = F.linear(h, weight)
    if up is not None:
        width = up if width is None else width
        return F.silu(y[..., :width]) * y[..., up : up + width]
    return residual + y if residual is not None else y


def norm_add_gemv_ref(
    res: Tensor, y: Tensor, w1: Tensor, eps1: float | None, weight: Tensor, w2: Tensor, eps2: float | None,
    *, up: int | None = None, width: int | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(s, out): a sandwich block's `norm_add_rmsnorm` (s = res + RMSNorm(y) · γ₁, n = RMSNorm(s) · γ₂)
    then `gemv_ref(n, weight)` with its SwiGLU when `up` is given."""
    n, s = norm_add_rmsnorm_ref(res, y, w1, eps1, w2, eps2)
    return s, gemv_ref(n, weight, up=up, width=width)


def _f64(v):
    return v.double() if isinstance(v, torch.Tensor) else v


def gemv_chain_f64(x: Tensor, weight: Tensor, **kw) -> Tensor:
    """`gemv_ref` of float64 copies: the truth the kernel is held to."""
    return gemv_ref(x.double(), weight.double(), **{k: _f64(v) for k, v in kw.items()})


def norm_add_gemv_chain_f64(*args, **kw) -> tuple[Tensor, Tensor]:
    """`norm_add_gemv_ref` of float64 copies."""
    return norm_add_gemv_ref(*map(_f64, args), **kw)
