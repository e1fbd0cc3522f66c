"""Causal Toeplitz mixing by cuFFT with fused Triton passes around the transforms (mixers.md §13).

Forward, for x `[B, T, C]` and N = next power of two ≥ 2T (no wrap-around, see fft_ref.py):
1. `pad_transpose_kernel`: x → fp32 `[B, C, N]`, transposed (time contiguous for cuFFT), zero-padded
   and cast in one pass.
2. X = rfft(·) (cuFFT, fp32), W = rfft(w[..., :T], N) (small).
3. `mix_kernel`: Y[b, c] = Σ_j W[j, head(c)] X[b, c − k + 1 + j] (the kernel variant's channel window
   summed in the frequency domain, one pass over X).
4. irfft, then `unpad_transpose_kernel`: the first T samples back to `[B, T, C]` with the position
   bias added and the cast to x's dtype, in one pass.
Backward: dx by the same passes with conj(W) and the channel window mirrored (a correlation);
dW[j, h] = Σ_{b, c ∈ h} DY[b, c] conj(X[b, c − k + 1 + j]) reduced in `dw_kernel` before one small
irfft; db = Σ over batch and the head's channels of dy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import new_empty
from ..common.tiles import cast
from .fft_ref import fft_size

BLOCK_T, BLOCK_C, BLOCK_F = 64, 64, 512


@triton.jit(do_not_specialize=["T", "N"])
def pad_transpose_kernel(x, out, T, N, C: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """out[b, c, t] = x[b, t, c] (fp32) for t < T, 0 for T ≤ t < N."""
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    p_x = x + i_b.to(tl.int64) * T * C + o_t[:, None] * C + o_c[None, :]
    b_x = tl.load(p_x, mask=(o_t < T)[:, None] & m_c[None, :], other=0.0).to(tl.float32)
    p_o = out + i_b.to(tl.int64) * C * N + o_c[None, :].to(tl.int64) * N + o_t[:, None]
    tl.store(p_o, b_x, mask=(o_t < N)[:, None] & m_c[None, :])


@triton.jit(do_not_specialize=["T", "N"])
def unpad_transpose_kernel(
    y, bias, out, T, N, n_bias,
    C: tl.constexpr, CH: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """out[b, t, c] = y[b, c, t] + bias[c // CH, t] for t < T, cast to out's dtype."""
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    mask = (o_t < T)[:, None] & (o_c < C)[None, :]
    p_y = y + i_b.to(tl.int64) * C * N + o_c[None, :].to(tl.int64) * N + o_t[:, None]
    b_y = tl.load(p_y, mask=mask, other=0.0)
    if HAS_BIAS:
        b_y += tl.load(bias + (o_c // CH)[None, :] * n_bias + o_t[:, None], mask=mask, other=0.0).to(
            tl.float32
        )
    p_o = out + i_b.to(tl.int64) * T * C + o_t[:, None] * C + o_c[None, :]
    tl.store(p_o, cast(b_y, out.dtype.element_ty), mask=mask)


@triton.jit
def mix_kernel(
    X, W, Y, F,
    C: tl.constexpr, CH: tl.constexpr, HEADS: tl.constexpr, KW: tl.constexpr, BF: tl.constexpr,
    ADJOINT: tl.constexpr,
):  # fmt: skip
    """Complex channel-window product on `[.., F, 2]` (re, im) views.

    Forward: Y[b, c] = Σ_j W[j, head(c)] X[b, c − KW + 1 + j].
    Adjoint (ADJOINT): Y[b, c] = Σ_j conj(W[j, head(c + KW − 1 − j)]) X[b, c + KW − 1 − j].
    """
    i_f, i_bc = tl.program_id(0), tl.program_id(1)
    i_b, i_c = i_bc // C, i_bc % C
    o_f = i_f * BF + tl.arange(0, BF)
    m_f = o_f < F
    acc_re = tl.zeros([BF], dtype=tl.float32)
    acc_im = tl.zeros([BF], dtype=tl.float32)
    for j in tl.static_range(KW):
        if ADJOINT:
            c_x = i_c + KW - 1 - j
            h = c_x // CH
            sgn = -1.0
        else:
            c_x = i_c - KW + 1 + j
            h = i_c // CH
            sgn = 1.0
        # a channel outside [0, C) is the zero padding of the window
        m = m_f & (o_f * 0 + c_x >= 0) & (o_f * 0 + c_x < C)
        p_x = X + ((i_b.to(tl.int64) * C + c_x) * F + o_f) * 2
        x_re = tl.load(p_x, mask=m, other=0.0)
        x_im = tl.load(p_x + 1, mask=m, other=0.0)
        p_w = W + ((j * HEADS + h) * F + o_f) * 2
        w_re = tl.load(p_w, mask=m, other=0.0)
        w_im = tl.load(p_w + 1, mask=m, other=0.0) * sgn
        acc_re += x_re * w_re - x_im * w_im
        acc_im += x_re * w_im + x_im * w_re
    p_y = Y + ((i_b.to(tl.int64) * C + i_c) * F + o_f) * 2
    tl.store(p_y, acc_re, mask=m_f)
    tl.store(p_y + 1, acc_im, mask=m_f)


@triton.jit
def dw_kernel(
    DY, X, DW, F, B,
    C: tl.constexpr, CH: tl.constexpr, HEADS: tl.constexpr, KW: tl.constexpr, BF: tl.constexpr,
):  # fmt: skip
    """DW[j, h] = Σ_b Σ_{c in head h} DY[b, c] conj(X[b, c − KW + 1 + j]) on `[.., F, 2]` views."""
    i_f, i_jh = tl.program_id(0), tl.program_id(1)
    j, h = i_jh // HEADS, i_jh % HEADS
    o_f = i_f * BF + tl.arange(0, BF)
    m_f = o_f < F
    # int64 offsets: B·C·F·2 passes 2^31 at long contexts
    zero = o_f.to(tl.int64) * 0
    acc_re = tl.zeros([BF], dtype=tl.float32)
    acc_im = tl.zeros([BF], dtype=tl.float32)
    for i_b in range(B):
        for cc in range(CH):
            c = h * CH + cc
            c_x = c - KW + 1 + j
            m = m_f & (o_f * 0 + c_x >= 0)
            p_dy = DY + ((zero + i_b * C + c) * F + o_f) * 2
            p_x = X + ((zero + i_b * C + c_x) * F + o_f) * 2
            dy_re = tl.load(p_dy, mask=m_f, other=0.0)
            dy_im = tl.load(p_dy + 1, mask=m_f, other=0.0)
            x_re = tl.load(p_x, mask=m, other=0.0)
            x_im = tl.load(p_x + 1, mask=m, other=0.0)
            acc_re += dy_re * x_re + dy_im * x_im
            acc_im += dy_im * x_re - dy_re * x_im
    p_w = DW + ((j * HEADS + h) * F + o_f) * 2
    tl.store(p_w, acc_re, mask=m_f)
    tl.store(p_w + 1, acc_im, mask=m_f)


def _to_freq(x: torch.Tensor, N: int) -> torch.Tensor:
    """rfft along time of x `[B, T, C]` as fp32 `[B, C, F]` complex, via the fused pad/transpose pass."""
    B, T, C = x.shape
    xt = new_empty(x, B, C, N, dtype=torch.float32)
    grid = (triton.cdiv(N, BLOCK_T), triton.cdiv(C, BLOCK_C), B)
    pad_transpose_kernel[grid](x, xt, T, N, C=C, BT=BLOCK_T, BC=BLOCK_C)
    return torch.fft.rfft(xt, dim=-1)


def _from_freq(Yf: torch.Tensor, T: int, N: int, bias, heads: int, dtype) -> torch.Tensor:
    """First T samples of irfft(Yf) (`[B, C, F]`) as `[B, T, C]` in `dtype`, plus bias `[heads, n]`."""
    B, C, _ = Yf.shape
    y = torch.fft.irfft(Yf, n=N, dim=-1)
    out = new_empty(y, B, T, C, dtype=dtype)
    grid = (triton.cdiv(T, BLOCK_T), triton.cdiv(C, BLOCK_C), B)
    n_bias = 0 if bias is None else bias.shape[-1]
    unpad_transpose_kernel[grid](
        y, bias, out, T, N, n_bias, C=C, CH=C // heads, BT=BLOCK_T, BC=BLOCK_C, HAS_BIAS=bias is not None
    )
    return out


def _mix(Xf: torch.Tensor, Wf: torch.Tensor, adjoint: bool) -> torch.Tensor:
    B, C, F = Xf.shape
    kernel, heads, _ = Wf.shape
    Yf = torch.empty_like(Xf)
    grid = (triton.cdiv(F, BLOCK_F), B * C)
    mix_kernel[grid](
        torch.view_as_real(Xf), torch.view_as_real(Wf), torch.view_as_real(Yf), F,
        C=C, CH=C // heads, HEADS=heads, KW=kernel, BF=BLOCK_F, ADJOINT=adjoint,
    )  # fmt: skip
    return Yf


def _weights_freq(w: torch.Tensor, T: int, N: int) -> torch.Tensor:
    return torch.fft.rfft(w[..., :T].float(), n=N, dim=-1).contiguous()


def toeplitz_fft_fwd(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y `[B, T, C]` (dtype of x) for w `[kernel, heads, n]`, bias `[heads, n]` or None."""
    B, T, C = x.shape
    N = fft_size(T)
    Yf = _mix(_to_freq(x.contiguous(), N), _weights_freq(w, T, N), adjoint=False)
    b = None if bias is None else bias.float().contiguous()
    return _from_freq(Yf, T, N, b, w.shape[1], x.dtype)


def toeplitz_fft_bwd(dy, x, w, has_bias: bool):
    """(dx `[B, T, C]`, dw `[kernel, heads, n]` fp32, db `[heads, n]` fp32 or None)."""
    B, T, C = x.shape
    kernel, heads, n = w.shape
    N = fft_size(T)
    DY = _to_freq(dy.contiguous(), N)
    dx = _from_freq(_mix(DY, _weights_freq(w, T, N), adjoint=True), T, N, None, heads, x.dtype)
    Xf = _to_freq(x.contiguous(), N)
    F = Xf.shape[-1]
    DW = torch.empty(kernel, heads, F, dtype=Xf.dtype, device=x.device)
    grid = (triton.cdiv(F, BLOCK_F), kernel * heads)
    dw_kernel[grid](
        torch.view_as_real(DY), torch.view_as_real(Xf), torch.view_as_real(DW), F, B,
        C=C, CH=C // heads, HEADS=heads, KW=kernel, BF=BLOCK_F,
    )  # fmt: skip
    dw = torch.zeros(kernel, heads, n, dtype=torch.float32, device=x.device)
    dw[..., :T] = torch.fft.irfft(DW, n=N, dim=-1)[..., :T]
    db = None
    if has_bias:
        db = torch.zeros(heads, n, dtype=torch.float32, device=x.device)
        db[:, :T] = dy.float().view(B, T, heads, C // heads).sum((0, 3)).transpose(0, 1)
    return dx, dw, db
