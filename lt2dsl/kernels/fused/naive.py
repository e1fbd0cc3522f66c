"""Reference implementations of the fused ops: the unfused PyTorch math, float64-capable.

Each function computes exactly what the pair of lowered-graph nodes it replaces computes (same
ops, same order, same dtypes), so in float64 the fused graph's reference path equals the unfused
graph bitwise; the Triton kernels are compared against these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lt2dsl.kernels.common.norm import l2norm

ACTS = (None, "silu", "sigmoid")
# L2Norm(x) = x / sqrt(Σx² + 1e-6) (mixers.md §0; the delta-rule cores' eps).
L2_EPS = 1e-6


def wide_dtype(t: Tensor) -> torch.dtype:
    """fp32, or float64 for float64 tensors: the dtype norms and gates are computed in."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def add_rmsnorm_ref(x: Tensor, r: Tensor, weight: Tensor | None, eps: float | None) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + r), x + r) over the last dim: `nn.RMSNorm` applied to the residual sum."""
    s = x + r
    return F.rms_norm(s, (s.shape[-1],), weight, eps), s


def norm_add_rmsnorm_ref(
    x: Tensor,
    y: Tensor,
    w1: Tensor,
    eps1: float | None,
    w2: Tensor,
    eps2: float | None,
) -> tuple[Tensor, Tensor]:
    """A sandwich block's residual add: `add_rmsnorm_ref(x, RMSNorm(y) · γ₁, γ₂, eps2)`."""
    return add_rmsnorm_ref(x, F.rms_norm(y, (y.shape[-1],), w1, eps1), w2, eps2)


def linear_split_ref(x: Tensor, weights: list[Tensor], biases: list[Tensor] | None) -> tuple[Tensor, ...]:
    """One `F.linear` per projection (the unfused graph)."""
    bs = biases if biases is not None else [None] * len(weights)
    return tuple(F.linear(x, w, b) for w, b in zip(weights, bs))


def conv_silu_ref(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    hist: Tensor | None,
    head_dim: int = 0,
) -> Tensor:
    """Causal depthwise conv + SiLU (mixers.md §0 ShortConv), then L2Norm per head of `head_dim`.

    Args:
        x: `[B, T, C]` inputs; weight `[C, 1, W]` (tap W−1 hits x_t); bias `[C]` or None.
        hist: the W−1 inputs before x `[B, C, W−1]` (a decode cache), or None for zeros.
        head_dim: L2-normalise each group of `head_dim` channels after the SiLU (0: no norm).
    Returns:
        `[B, T, C]` in x's dtype.
    """
    W = weight.shape[-1]
    xt = x.transpose(1, 2)  # [B, C, T]
    if hist is None:
        hist = xt.new_zeros(xt.shape[0], xt.shape[1], W - 1)
    full = torch.cat([hist.to(xt.dtype), xt], dim=-1)
    y = F.silu(F.conv1d(full, weight, bias, groups=weight.shape[0]).transpose(1, 2))
    if not head_dim:
        return y
    return l2norm(y.unflatten(-1, (-1, head_dim))).flatten(-2)


def conv_silu_step_ref(
    xs: list[Tensor],
    weights: list[Tensor],
    biases: list[Tensor | None],
    hists: list[Tensor],
    head_dims: list[int],
) -> tuple[Tensor, ...]:
    """The decode step of several short convs: `conv_silu_ref` of each x `[B, 1, C_i]` with its
    history `[B, C_i, W−1]`, which then takes x as its newest column (in place). Returns the ys."""
    ys = []
    for x, w, b, h, hd in zip(xs, weights, biases, hists, head_dims, strict=True):
        ys.append(conv_silu_ref(x, w, b, h, hd))
        h.copy_(torch.cat([h[..., 1:], x.detach().transpose(1, 2).to(h.dtype)], dim=-1))
    return tuple(ys)


def rope_ref(x: Tensor, c: Tensor, s: Tensor) -> Tensor:
    """Half-split RoPE of the first R channels of each head of x `[B, T, H, D]`, the rest as they are.

    c, s: `[B or 1, T, R]` rows of `lowering.functional.rope_rows` (the rotation's dtype). In c's
    dtype: x ⊙ c + rotate(x) ⊙ s with rotate(x) = (x₂, x₁) the halves swapped, rounded to x's dtype.
    """
    R = c.shape[-1]
    xf = x[..., :R].to(c.dtype)
    rotated = torch.cat([xf[..., R // 2 :], xf[..., : R // 2]], dim=-1)
    y = torch.addcmul(xf * c[:, :, None, :], rotated, s[:, :, None, :]).to(x.dtype)
    return y if x.shape[-1] == R else torch.cat([y, x[..., R:]], dim=-1)


def rope_cache_ref(
    q: Tensor, k: Tensor, v: Tensor | None, c: Tensor, s: Tensor, k_cache: Tensor, v_cache: Tensor | None,
    positions: Tensor, ring: bool = False, norm: tuple | None = None,
) -> Tensor:  # fmt: skip
    """One token per row: RoPE of q; k LayerNorm-ed (`norm` = (weight, bias, eps)) and turned, then
    written with v into the caches `[B, Hk, L, D]` at slot positions[b] (mod L with `ring`).

    q `[B, 1, Hq, D]`; k, v `[B, 1, Hk, D]`; c, s `[B, R]`. Returns q turned (`rope_ref`)."""
    if norm is not None:
        k = F.layer_norm(k, (k.shape[-1],), norm[0], norm[1], norm[2])
    cq, sq = c[:, None], s[:, None]
    yq, yk = rope_ref(q, cq, sq), rope_ref(k, cq, sq)
    slot = torch.remainder(positions, k_cache.shape[2]) if ring else positions
    rows = torch.arange(q.shape[0], device=q.device)
    k_cache[rows, :, slot] = yk[:, 0].to(k_cache.dtype)
    if v is not None:
        v_cache[rows, :, slot] = v[:, 0].to(v_cache.dtype)
    return yq


def xpos_ref(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor) -> Tensor:
    """RetNet's interleaved-pair rotation of x `[B, T, H, D]`: pair (2j, 2j+1) of the token at
    position p turns by the angle of row p, column j of the tables cos, sin `[P, D/2]`
    (`lowering.functional_recurrent.xpos_angles`). positions `[T]` (shared by the rows) or `[B, T]`.
    In the tables' dtype, rounded to x's dtype: `functional_recurrent.xpos_at` on gathered rows."""
    c, s = cos[positions].unsqueeze(-2), sin[positions].unsqueeze(-2)  # [(B,) T, 1, D/2]
    xf = x.to(cos.dtype)
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).flatten(-2).to(x.dtype)


def mamba2_gate_ref(
    a: Tensor, x: Tensor, A_log: Tensor, dt_bias: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Mamba2's gates (mixers.md §7(a)) in `dtype`: dt = softplus(a + dt_bias), the core's value
    v = dt · x (rounded to x's dtype) and log decay g = dt · (−exp(A_log)).

    a `[B, T, H]` the raw dt projection; x `[B, T, H, P]` the conv output's heads; A_log,
    dt_bias `[H]`. Returns (v `[B, T, H, P]` in x's dtype, g `[B, T, H]` in `dtype`). These are the
    ops, in their order, that `layers.mamba2.mamba2_gates` runs for prefill and training.
    """
    dt = F.softplus(a.to(dtype) + dt_bias.to(dtype))
    g = dt * -A_log.to(dtype).exp()
    v = (dt[..., None] * x.to(dtype)).to(x.dtype)
    return v, g


def gdn_gate_ref(
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    beta_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """GDN gates (mixers.md §5(a)) in `dtype`: g = −exp(A_log) · softplus(a + dt_bias), β = s · σ(b).

    a, b `[B, T, HV]` raw projections; A_log, dt_bias `[HV]`.
    """
    g = -A_log.to(dtype).exp() * F.softplus(a.to(dtype) + dt_bias.to(dtype))
    beta = torch.sigmoid(b.to(dtype))
    if beta_scale != 1.0:
        beta = beta * beta_scale
    return g, beta


def gated_rmsnorm_ref(
    o: Tensor,
    gate: Tensor | None,
    weight: Tensor,
    eps: float,
    act: str | None,
    group: int,
    norm_before_gate: bool = True,
) -> Tensor:
    """`GatedRMSNorm` (lowering/functional_recurrent.py): RMSNorm over groups of `group` channels
    of o's last dim (= weight's length), gated by act(gate) after (fla) or before (Mamba2) the norm."""
    dt = wide_dtype(weight)
    y = o.to(dt)
    a = None
    if act is not None:
        a = F.silu(gate.to(dt)) if act == "silu" else torch.sigmoid(gate.to(dt))
    if a is not None and not norm_before_gate:
        y = y * a
    y = y.unflatten(-1, (-1, group))
    y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)
    y = y * weight.to(dt)
    if a is not None and norm_before_gate:
        y = y * a
    return y.to(weight.dtype)


def gated_rmsnorm_linear_ref(
    o: Tensor,
    gate: Tensor | None,
    norm_weight: Tensor,
    proj_weight: Tensor,
    proj_bias: Tensor | None,
    eps: float,
    act: str | None,
    group: int,
    norm_before_gate: bool = True,
    n_flat: int = 1,
) -> Tensor:
    """`out_proj(GatedRMSNorm(o, gate).flatten(-n_flat))`: o `[..., dim]` → `[*o.shape[:-n_flat], D]`."""
    y = gated_rmsnorm_ref(o, gate, norm_weight, eps, act, group, norm_before_gate)
    if n_flat > 1:
        y = y.flatten(-n_flat)
    return F.linear(y, proj_weight, proj_bias)


def swiglu_ref(a: Tensor, b: Tensor) -> Tensor:
    """SiLU(a) ⊙ b (the SwiGLU MLP's activation and product)."""
    return F.silu(a) * b
