"""Triton kernels of the fused short conv: causal depthwise conv + SiLU (+ L2Norm per head).

Forward, per tile of BT positions × BC channels of one sequence (mixers.md §0 ShortConv):
    pre_t[c] = b[c] + Σ_{j<W} w[c, j] · x_{t−W+1+j}[c]   (inputs before x come from `hist`, else 0)
    y_t[c]   = SiLU(pre_t[c])  [· rsqrt(Σ_{c ∈ head} SiLU(pre_t[c])² + 1e-6)  with L2, BC = head]
Backward in two kernels: (1) recompute pre and write dpre = ∂L/∂pre; (2) dx_t = Σ_j w[j] ·
dpre_{t+W−1−j} (inside the sequence) and per-tile partial dw, db (summed on the host). The decode
cache (`hist` in and out) is handled by the caller exactly as `lowering.functional.short_conv` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import configs, pow2

L2_EPS = 1e-6
# Compiled kernels may read a module global only as a tl.constexpr (the CPU interpreter reads any).
_EPS = tl.constexpr(L2_EPS)


@triton.jit
def _tile(T, C, BT: tl.constexpr, BC: tl.constexpr, HD: tl.constexpr):
    """This program's tile of `[B, T, C]`: (sequence i_b (int64), time tile i_t, positions o_t `[BT]`,
    channels o_c `[BC]` (HD of them real), their masks m_t, m_c)."""
    i_c, i_t, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * HD + tl.arange(0, BC)
    m_t, m_c = o_t < T, (tl.arange(0, BC) < HD) & (o_c < C)
    return i_b, i_t, o_t, o_c, m_t, m_c


@triton.jit
def _tap_input(x, h, i_b, src, o_c, m_t, m_c, sxb, sxt, shb, shc, W: tl.constexpr, HAS_H: tl.constexpr):
    """x at positions src = t−W+1+j `[BT, BC]` (fp32), what tap j reads for pre_t: from `hist` before
    the sequence's start (with HAS_H), else 0 there; m_t masks the rows t, m_c the channels."""
    m_x = ((src >= 0) & m_t)[:, None] & m_c[None, :]
    b_x = tl.load(x + i_b * sxb + src[:, None] * sxt + o_c[None, :], mask=m_x, other=0.0).to(tl.float32)
    if HAS_H:
        m_h = ((src < 0) & m_t)[:, None] & m_c[None, :]
        p_h = h + i_b * shb + o_c[None, :] * shc + (src + (W - 1))[:, None]
        b_x += tl.load(p_h, mask=m_h, other=0.0).to(tl.float32)
    return b_x


@triton.jit
def _conv_tile(
    x, h, w, bias, i_b, o_t, o_c, m_t, m_c, sxb, sxt, shb, shc,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_H: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
    """pre `[BT, BC]` (fp32) of the conv at positions o_t, channels o_c of sequence i_b."""
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    if HAS_B:
        acc += tl.load(bias + o_c, mask=m_c, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(W):
        src = o_t - (W - 1) + j
        b_w = tl.load(w + o_c * W + j, mask=m_c, other=0.0).to(tl.float32)
        b_x = _tap_input(x, h, i_b, src, o_c, m_t, m_c, sxb, sxt, shb, shc, W, HAS_H)
        acc += b_x * b_w[None, :]
    return acc


@triton.autotune(configs(4, 8), key=["BT", "BC", "W", "L2"])
@triton.jit
def conv_silu_fwd_kernel(
    x, h, w, bias, y, T, C, sxb, sxt, shb, shc,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HD: tl.constexpr, HAS_H: tl.constexpr,
    HAS_B: tl.constexpr, L2: tl.constexpr,
):  # fmt: skip
    i_b, i_t, o_t, o_c, m_t, m_c = _tile(T, C, BT, BC, HD)
    pre = _conv_tile(x, h, w, bias, i_b, o_t, o_c, m_t, m_c, sxb, sxt, shb, shc, W, BT, BC, HAS_H, HAS_B)
    b_y = pre * tl.sigmoid(pre)
    if L2:
        b_y = b_y / tl.sqrt(tl.sum(b_y * b_y, axis=1) + _EPS)[:, None]
    p_y = y + (i_b * T + o_t)[:, None] * C + o_c[None, :]
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m_t[:, None] & m_c[None, :])


@triton.autotune(configs(4, 8), key=["BT", "BC", "W", "L2"])
@triton.jit
def conv_silu_bwd_pre_kernel(
    x, h, w, bias, dy, dpre, T, C, sxb, sxt, shb, shc,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HD: tl.constexpr, HAS_H: tl.constexpr,
    HAS_B: tl.constexpr, L2: tl.constexpr,
):  # fmt: skip
    i_b, i_t, o_t, o_c, m_t, m_c = _tile(T, C, BT, BC, HD)
    m = m_t[:, None] & m_c[None, :]
    pre = _conv_tile(x, h, w, bias, i_b, o_t, o_c, m_t, m_c, sxb, sxt, shb, shc, W, BT, BC, HAS_H, HAS_B)
    p = (i_b * T + o_t)[:, None] * C + o_c[None, :]
    b_dy = tl.load(dy + p, mask=m, other=0.0).to(tl.float32)
    sig = tl.sigmoid(pre)
    if L2:
        b_u = pre * sig
        rstd = 1.0 / tl.sqrt(tl.sum(b_u * b_u, axis=1) + _EPS)
        b_yn = b_u * rstd[:, None]
        b_dy = rstd[:, None] * (b_dy - b_yn * tl.sum(b_dy * b_yn, axis=1)[:, None])
    b_dpre = b_dy * sig * (1.0 + pre * (1.0 - sig))
    tl.store(dpre + p, b_dpre.to(dpre.dtype.element_ty), mask=m)


@triton.autotune(configs(4, 8), key=["BT", "BC", "W"])
@triton.jit
def conv_silu_bwd_dx_kernel(
    x, h, w, dpre, dx, dw_part, db_part, T, C, sxb, sxt, shb, shc, n_t,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HD: tl.constexpr, HAS_H: tl.constexpr,
):  # fmt: skip
    i_b, i_t, o_t, o_c, m_t, m_c = _tile(T, C, BT, BC, HD)
    m = m_t[:, None] & m_c[None, :]
    b_dx = tl.zeros([BT, BC], dtype=tl.float32)
    b_d = tl.load(dpre + (i_b * T + o_t)[:, None] * C + o_c[None, :], mask=m, other=0.0).to(tl.float32)
    p_part = (i_b * n_t + i_t) * C + o_c
    tl.store(db_part + p_part, tl.sum(b_d, axis=0), mask=m_c)
    for j in tl.static_range(W):
        b_w = tl.load(w + o_c * W + j, mask=m_c, other=0.0).to(tl.float32)
        # x_t feeds pre_{t+W−1−j} through tap j
        dst = o_t + (W - 1) - j
        m_d = (dst < T)[:, None] & m
        b_dd = tl.load(dpre + (i_b * T + dst)[:, None] * C + o_c[None, :], mask=m_d, other=0.0)
        b_dx += b_dd.to(tl.float32) * b_w[None, :]
        # tap j reads x_{t−W+1+j} for pre_t
        src = o_t - (W - 1) + j
        b_x = _tap_input(x, h, i_b, src, o_c, m_t, m_c, sxb, sxt, shb, shc, W, HAS_H)
        tl.store(dw_part + p_part * W + j, tl.sum(b_d * b_x, axis=0), mask=m_c)
    tl.store(dx + (i_b * T + o_t)[:, None] * C + o_c[None, :], b_dx.to(dx.dtype.element_ty), mask=m)


def _blocks(T: int, C: int, head_dim: int) -> tuple[int, int, int]:
    """(BT, BC, HD): HD channels per program (one head with L2, else up to 128), BC = pow2(HD)."""
    HD = head_dim if head_dim else min(128, pow2(C))
    BC = pow2(HD)
    BT = max(1, min(64, pow2(T), 8192 // BC))
    return BT, BC, HD


def _strides(x: torch.Tensor, hist: torch.Tensor | None) -> tuple[int, int, int, int]:
    shb, shc = (0, 0) if hist is None else (hist.stride(0), hist.stride(1))
    return x.stride(0), x.stride(1), shb, shc


def prepare(x: torch.Tensor, hist: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x with unit channel stride, hist `[B, C, W−1]` with unit time stride and x's dtype."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if hist is not None:
        hist = hist.to(x.dtype)
        if hist.stride(-1) != 1:
            hist = hist.contiguous()
    return x, hist


def _launch_pre(kernel, x, hist, w2, bias, tensors, head_dim: int) -> None:
    """Launch `kernel` (`conv_silu_fwd_kernel` or `conv_silu_bwd_pre_kernel`, which both recompute
    the pre-activation of their (channel tile, time tile, sequence)) on x `[B, T, C]`, hist, w2 and
    bias, then `tensors` (the kernel's own outputs and inputs)."""
    B, T, C = x.shape
    BT, BC, HD = _blocks(T, C, head_dim)
    grid = (triton.cdiv(C, HD), triton.cdiv(T, BT), B)
    flags = dict(HAS_H=hist is not None, HAS_B=bias is not None, L2=head_dim > 0)
    strides = _strides(x, hist)
    kernel[grid](x, hist, w2, bias, *tensors, T, C, *strides, W=w2.shape[1], BT=BT, BC=BC, HD=HD, **flags)


def conv_silu_fwd(
    x: torch.Tensor, w2: torch.Tensor, bias: torch.Tensor | None, hist: torch.Tensor | None, head_dim: int
) -> torch.Tensor:
    """x `[B, T, C]`, w2 `[C, W]` contiguous → y `[B, T, C]` contiguous in x's dtype."""
    x, hist = prepare(x, hist)
    B, T, C = x.shape
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    if B * T * C:
        _launch_pre(conv_silu_fwd_kernel, x, hist, w2, bias, (y,), head_dim)
    return y


def conv_silu_bwd(
    dy: torch.Tensor, x: torch.Tensor, w2: torch.Tensor, bias: torch.Tensor | None, hist: torch.Tensor | None,
    head_dim: int,
):  # fmt: skip
    """(dx `[B, T, C]` in x's dtype, dw `[C, W]` fp32, db `[C]` fp32)."""
    x, hist = prepare(x, hist)
    B, T, C = x.shape
    W = w2.shape[1]
    dx = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    if not B * T * C:
        return dx, x.new_zeros(C, W, dtype=torch.float32), x.new_zeros(C, dtype=torch.float32)
    dy = dy if dy.is_contiguous() else dy.contiguous()
    dpre = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    _launch_pre(conv_silu_bwd_pre_kernel, x, hist, w2, bias, (dy, dpre), head_dim)
    # dx is channel-parallel: any channel tile works, so the plain (widest) one is used
    BT, BC, HD = _blocks(T, C, 0)
    n_t = triton.cdiv(T, BT)
    dw_part = torch.empty(B * n_t, C, W, dtype=torch.float32, device=x.device)
    db_part = torch.empty(B * n_t, C, dtype=torch.float32, device=x.device)
    conv_silu_bwd_dx_kernel[(triton.cdiv(C, HD), n_t, B)](
        x, hist, w2, dpre, dx, dw_part, db_part, T, C, *_strides(x, hist), n_t,
        W=W, BT=BT, BC=BC, HD=HD, HAS_H=hist is not None,
    )  # fmt: skip
    return dx, dw_part.sum(0), db_part.sum(0)
