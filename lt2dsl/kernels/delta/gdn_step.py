"""One GDN decode step in two launches: the q, k, v short convs inside the gated recurrence, then
the gated output norm with the q/k conv histories' shift.

What `fused.conv_silu_step` (q, k, v convs + SiLU, q and k L2-normalised, histories shifted),
`delta.gates.gdn_decode_gates` (gates from the raw projections, the recurrence, the state in
place) and the gated RMSNorm of `fused.gated_rmsnorm_linear` compute for one token per row, three
launches, in two:

1. `gdn_step_recurrent_kernel`, one program per (V tile, row · value head) as the recurrent
   kernel's grid: the program forms its head's q and k from the conv histories and the new
   inputs (every V tile of a head does, reading the histories only), its V tile's v (whose
   history channels are its own: shifted in place), the gates, and the recurrence on its
   `[K, BV]` slice of the state (updated in place); o is written in the output dtype, as the core's.
2. `gdn_step_norm_kernel`, one program per (row, value head): RMSNorm(o) · γ · SiLU(z) over the
   head's V channels (fla's norm before the gate), and, by the first value head of each q/k head,
   the q and k histories' shift, which must wait until every program of step 1 has read them.

The rounding points are the unfused chain's: q, k, v in the inputs' dtype after the convs, o in
the output dtype, the norm in fp32 once. `naive.gdn_step_ref` composes the three references.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lt2dsl.kernels.common.tl_util import cast
from lt2dsl.kernels.fused.triton_act import _softplus
from lt2dsl.kernels.fused.triton_conv import L2_EPS

_L2_EPS = tl.constexpr(L2_EPS)


@triton.jit
def _history(h_row, c, m, shc, W: tl.constexpr, WP: tl.constexpr):
    """The W − 1 history columns of channels c as one `[len(c), WP]` tile (WP ≥ W − 1 a power of
    two; the columns past W − 2 zero) and their pointers."""
    cols = tl.arange(0, WP)
    p_h = h_row + c[:, None] * shc + cols[None, :]
    return tl.load(p_h, mask=m[:, None] & (cols < W - 1)[None, :], other=0.0), p_h, cols


@triton.jit
def _store_shifted(hist, p_h, cols, b_x, m, W: tl.constexpr):
    """The history takes x as its newest column: column j − 1 ← column j (from the tile read
    before), column W − 2 ← x. A channel's value is held by several threads (the 1-D layout of a
    multi-warp program replicates it), so every thread must have read the history before any
    writes it: the barrier orders all reads before all writes."""
    tl.debug_barrier()
    tl.store(p_h - 1, hist, mask=m[:, None] & (cols >= 1)[None, :] & (cols < W - 1)[None, :])
    last = tl.where((cols == W - 2)[None, :], b_x[:, None], hist)
    tl.store(p_h, last.to(p_h.dtype.element_ty), mask=m[:, None] & (cols == W - 2)[None, :])


@triton.jit
def _conv_silu(
    x_row,
    h_row,
    w,
    bias,
    c,
    m,
    shc,
    W: tl.constexpr,
    WP: tl.constexpr,
    HAS_B: tl.constexpr,
    SHIFT: tl.constexpr,
):
    """SiLU of the causal depthwise conv of channels c (mask m) at the new input: bias, then the
    W − 1 history taps oldest first, then x (the prefill kernel's order); with SHIFT the history
    takes x as its newest column (`_store_shifted`). fp32 `[len(c)]`."""
    acc = tl.zeros(c.shape, dtype=tl.float32)
    if HAS_B:
        acc += tl.load(bias + c, mask=m, other=0.0).to(tl.float32)
    hist, p_h, cols = _history(h_row, c, m, shc, W, WP)
    for j in tl.static_range(W - 1):
        b_h = tl.sum(tl.where((cols == j)[None, :], hist.to(tl.float32), 0.0), axis=1)  # column j, exact
        acc += b_h * tl.load(w + c * W + j, mask=m, other=0.0).to(tl.float32)
    b_x = tl.load(x_row + c, mask=m, other=0.0)
    acc += b_x.to(tl.float32) * tl.load(w + c * W + (W - 1), mask=m, other=0.0).to(tl.float32)
    if SHIFT:
        _store_shifted(hist, p_h, cols, b_x, m, W)
    return acc * tl.sigmoid(acc)


@triton.jit
def _shift(x_row, h_row, c, m, shc, W: tl.constexpr, WP: tl.constexpr):
    """The history of channels c takes the new input x as its newest column (`_store_shifted`)."""
    hist, p_h, cols = _history(h_row, c, m, shc, W, WP)
    _store_shifted(hist, p_h, cols, tl.load(x_row + c, mask=m, other=0.0), m, W)


@triton.jit
def gdn_step_recurrent_kernel(
    XQ, XK, XV, XA, XB, HQ, HK, HVH, WQ, WK, WV, BQ, BK_, BV_, A_log, dt_bias, S, O,
    sxq, sxk, sxv, sab, shq, shk, shv, shqc, shkc, shvc, scale, beta_scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, W: tl.constexpr, WP: tl.constexpr, HAS_BQ: tl.constexpr, HAS_BK: tl.constexpr,
    HAS_BV: tl.constexpr,
):  # fmt: skip
    """Program (V tile, b · HV + hv): step 1 of the module docstring. X* `[B, C]` rows sxq… apart
    (unit channel stride), XA/XB `[B, HV]` rows sab apart; H* `[B, C, W−1]` (batch, channel
    strides; unit time stride); S `[B, HV, K, V]` fp32; O `[B, HV, V]`."""
    recurrent_item(
        tl.program_id(0), tl.program_id(1), XQ, XK, XV, XA, XB, HQ, HK, HVH, WQ, WK, WV, BQ, BK_, BV_, A_log,
        dt_bias, S, O, sxq, sxk, sxv, sab, shq, shk, shv, shqc, shkc, shvc, scale, beta_scale,
        H, HV, K, V, BK, BV, W, WP, HAS_BQ, HAS_BK, HAS_BV,
    )  # fmt: skip


@triton.jit
def recurrent_item(
    i_v, i_bh, XQ, XK, XV, XA, XB, HQ, HK, HVH, WQ, WK, WV, BQ, BK_, BV_, A_log, dt_bias, S, O,
    sxq, sxk, sxv, sab, shq, shk, shv, shqc, shkc, shvc, scale, beta_scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, W: tl.constexpr, WP: tl.constexpr, HAS_BQ: tl.constexpr, HAS_BK: tl.constexpr,
    HAS_BV: tl.constexpr,
):  # fmt: skip
    """`gdn_step_recurrent_kernel`'s work for V tile i_v of row · value head i_bh (a persistent
    kernel calls it for the items it owns)."""
    b, hv = (i_bh // HV).to(tl.int64), i_bh % HV
    h = hv // (HV // H)
    ok = tl.arange(0, BK)
    mk = ok < K
    q = _conv_silu(XQ + b * sxq, HQ + b * shq, WQ, BQ, h * K + ok, mk, shqc, W, WP, HAS_BQ, False)
    k = _conv_silu(XK + b * sxk, HK + b * shk, WK, BK_, h * K + ok, mk, shkc, W, WP, HAS_BK, False)
    q = tl.where(mk, q, 0.0)
    k = tl.where(mk, k, 0.0)
    # L2 per head, then the inputs' dtype: what the conv kernel stores and the recurrence loads
    q = cast(q / tl.sqrt(tl.sum(q * q, 0) + _L2_EPS), XQ.dtype.element_ty).to(tl.float32)
    k = cast(k / tl.sqrt(tl.sum(k * k, 0) + _L2_EPS), XK.dtype.element_ty).to(tl.float32)
    ov = i_v * BV + tl.arange(0, BV)
    mv = ov < V
    v = _conv_silu(XV + b * sxv, HVH + b * shv, WV, BV_, hv * V + ov, mv, shvc, W, WP, HAS_BV, True)
    v = cast(v, XV.dtype.element_ty).to(tl.float32)
    b_a = tl.load(XA + b * sab + hv).to(tl.float32)
    b_b = tl.load(XB + b * sab + hv).to(tl.float32)
    sp, _ = _softplus(b_a + tl.load(dt_bias + hv).to(tl.float32))
    decay = tl.exp(-tl.exp(tl.load(A_log + hv).to(tl.float32)) * sp)
    beta = tl.sigmoid(b_b) * beta_scale
    p_s = S + (b * HV + hv) * K * V + ok[:, None] * V + ov[None, :]
    ms = mk[:, None] & mv[None, :]
    st = tl.load(p_s, mask=ms, other=0.0) * decay
    u = beta * (v - tl.sum(k[:, None] * st, 0))
    st += k[:, None] * u[None, :]
    o = tl.sum((q * scale)[:, None] * st, 0)
    tl.store(p_s, st, mask=ms)
    tl.store(O + (b * HV + hv) * V + ov, cast(o, O.dtype.element_ty), mask=mv)


@triton.jit
def gdn_step_norm_kernel(
    O, XZ, GAMMA, OUT, XQ, XK, HQ, HK, sxz, sxq, sxk, shq, shk, shqc, shkc, eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BVF: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
):  # fmt: skip
    """Program b · HV + hv: step 2 of the module docstring. O `[B, HV, V]`, XZ the gate `[B, HV·V]`
    rows sxz apart, GAMMA `[V]`; OUT `[B, HV, V]` in γ's dtype."""
    norm_item(
        tl.program_id(0), O, XZ, GAMMA, OUT, XQ, XK, HQ, HK, sxz, sxq, sxk, shq, shk, shqc, shkc, eps,
        H, HV, K, V, BK, BVF, W, WP,
    )  # fmt: skip


@triton.jit
def norm_item(
    i_bh, O, XZ, GAMMA, OUT, XQ, XK, HQ, HK, sxz, sxq, sxk, shq, shk, shqc, shkc, eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BVF: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
):  # fmt: skip
    """`gdn_step_norm_kernel`'s work for row · value head i_bh."""
    b, hv = (i_bh // HV).to(tl.int64), i_bh % HV
    ov = tl.arange(0, BVF)
    mv = ov < V
    row = (b * HV + hv) * V
    o = tl.load(O + row + ov, mask=mv, other=0.0).to(tl.float32)
    z = tl.load(XZ + b * sxz + hv * V + ov, mask=mv, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(o * o, 0) / V + eps)
    y = o * rstd * tl.load(GAMMA + ov, mask=mv, other=0.0).to(tl.float32) * (z * tl.sigmoid(z))
    tl.store(OUT + row + ov, cast(y, OUT.dtype.element_ty), mask=mv)
    G: tl.constexpr = HV // H
    if hv % G == 0:
        h = hv // G
        ok = tl.arange(0, BK)
        mk = ok < K
        _shift(XQ + b * sxq, HQ + b * shq, h * K + ok, mk, shqc, W, WP)
        _shift(XK + b * sxk, HK + b * shk, h * K + ok, mk, shkc, W, WP)


def _rows(x: Tensor) -> Tensor:
    """`[B, 1, C]` (or `[B, C]`) as `[B, C]` rows of unit channel stride: a view where it is one."""
    x2 = x.reshape(x.shape[0], x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def gdn_step(
    xq: Tensor, xk: Tensor, xv: Tensor, xa: Tensor, xb: Tensor, xz: Tensor,
    conv_weights: tuple[Tensor, ...], conv_biases: tuple[Tensor | None, ...], hists: tuple[Tensor, ...],
    A_log: Tensor, dt_bias: Tensor, state: Tensor, gamma: Tensor,
    *, heads: int, scale: float, beta_scale: float, eps: float,
) -> Tensor:  # fmt: skip
    """One GDN decode token per row, two launches (module docstring).

    Args:
        xq, xk: `[B, 1, H·K]`; xv, xz: `[B, 1, HV·V]`; xa, xb: `[B, 1, HV]`: the in-projection's
            outputs (column slices of one GEMM output are read in place).
        conv_weights: q, k, v conv weights `[C, 1, W]`; conv_biases: each `[C]` or None.
        hists: q, k, v histories `[B, C, W−1]` in x's dtype, shifted in place.
        A_log, dt_bias: `[HV]`; state `[B, HV, K, V]` fp32 contiguous, updated in place.
        gamma: the output norm's weight `[V]`; heads: H; scale: multiplied into q; beta_scale: s of
            β = s · σ(b); eps: the output norm's.
    Returns:
        `[B, 1, HV, V]` in γ's dtype: RMSNorm(o) · γ · SiLU(z) per value head.
    """
    B, HV, K, V = state.shape
    H = heads
    W = conv_weights[0].shape[-1]
    x2 = [_rows(x) for x in (xq, xk, xv, xa, xb, xz)]
    xa2, xb2 = x2[3], x2[4]
    if xa2.stride(0) != xb2.stride(0):
        xa2, xb2 = xa2.contiguous(), xb2.contiguous()
    w2 = [w.reshape(w.shape[0], W).contiguous() for w in conv_weights]
    bias = [w if b is None else b for b, w in zip(conv_biases, w2)]
    o = torch.empty(B, HV, V, device=state.device, dtype=xv.dtype)
    out = torch.empty(B, 1, HV, V, device=state.device, dtype=gamma.dtype)
    hq, hk, hv = hists
    BK, BV = triton.next_power_of_2(K), min(32, triton.next_power_of_2(V))
    gdn_step_recurrent_kernel[(triton.cdiv(V, BV), B * HV)](
        x2[0], x2[1], x2[2], xa2, xb2, hq, hk, hv, *w2, *bias, A_log, dt_bias, state, o,
        x2[0].stride(0), x2[1].stride(0), x2[2].stride(0), xa2.stride(0), hq.stride(0), hk.stride(0),
        hv.stride(0), hq.stride(1), hk.stride(1), hv.stride(1), scale, beta_scale,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, W=W, WP=triton.next_power_of_2(W - 1),
        HAS_BQ=conv_biases[0] is not None,
        HAS_BK=conv_biases[1] is not None, HAS_BV=conv_biases[2] is not None, num_warps=4,
    )  # fmt: skip
    gdn_step_norm_kernel[(B * HV,)](
        o, x2[5], gamma, out, x2[0], x2[1], hq, hk, x2[5].stride(0), x2[0].stride(0), x2[1].stride(0),
        hq.stride(0), hk.stride(0), hq.stride(1), hk.stride(1), eps,
        H=H, HV=HV, K=K, V=V, BK=BK, BVF=triton.next_power_of_2(V), W=W, WP=triton.next_power_of_2(W - 1),
        num_warps=4,
    )  # fmt: skip
    return out


def gdn_step_ref(
    xq, xk, xv, xa, xb, xz, conv_weights, conv_biases, hists, A_log, dt_bias, state, gamma,
    *, heads: int, scale: float, beta_scale: float, eps: float,
):  # fmt: skip
    """The three unfused references in order (`fused.naive.conv_silu_step_ref`,
    `delta.gates.gdn_decode_gates_ref`, `fused.naive.gated_rmsnorm_ref`): what `gdn_step`
    computes, the histories and state updated in place."""
    from lt2dsl.kernels.delta.gates import gdn_decode_gates_ref
    from lt2dsl.kernels.fused.naive import conv_silu_step_ref, gated_rmsnorm_ref

    B, HV, K, V = state.shape
    q, k, v = conv_silu_step_ref([xq, xk, xv], list(conv_weights), list(conv_biases), list(hists), [K, K, 0])
    o = gdn_decode_gates_ref(
        q.unflatten(-1, (heads, K)), k.unflatten(-1, (heads, K)), v.unflatten(-1, (HV, V)), xa, xb, A_log,
        dt_bias, state, beta_scale=beta_scale, scale=scale,
    )  # fmt: skip
    return gated_rmsnorm_ref(o, xz.unflatten(-1, (HV, V)), gamma, eps, "silu", V)
