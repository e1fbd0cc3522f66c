"""Triton kernel of the decode step of up to three short convs at once (a delta-rule layer's q, k,
v): causal depthwise conv + SiLU (+ L2Norm per head) of one new token per sequence, the conv
history updated in place.

Per conv i and channel c of sequence b, with the history h[b, c, 0..W−2] (the W−1 inputs before
x, oldest first) and x the new input:
    pre[c] = b[c] + Σ_{j<W−1} w[c, j] · h[c, j] + w[c, W−1] · x[c]   (taps in that order, as the
             prefill kernel `conv_silu_fwd_kernel` sums them)
    y[c]   = SiLU(pre[c])  [· rsqrt(Σ_{c ∈ head} SiLU(pre)² + 1e-6)  with L2]
    h[c]   ← (h[c, 1], …, h[c, W−2], x[c])
A program owns a block of HD channels (one head with L2) of one conv of one sequence and reads
each history column before it overwrites it, so the in-place update needs no synchronisation. One
launch replaces, per conv, the prefill kernel's launch and the history's concatenation and copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .common import pow2
from .triton_conv import L2_EPS

_EPS = tl.constexpr(L2_EPS)
# one warp per 32 channels of a program's block, at least one: the block is all a program holds
STEP_WARPS = 4


@triton.jit
def _conv_step(
    x, h, w, bias, y, i_b, i_c, C, sxb, shb, shc,
    W: tl.constexpr, BC: tl.constexpr, HD: tl.constexpr, HAS_B: tl.constexpr, L2: tl.constexpr,
):  # fmt: skip
    """One conv's step on channels i_c·HD … of sequence i_b (module docstring)."""
    o_c = i_c * HD + tl.arange(0, BC)
    m_c = (tl.arange(0, BC) < HD) & (o_c < C)
    acc = tl.zeros([BC], dtype=tl.float32)
    if HAS_B:
        acc += tl.load(bias + o_c, mask=m_c, other=0.0).to(tl.float32)
    p_h = h + i_b * shb + o_c * shc
    for j in tl.static_range(W - 1):
        b_h = tl.load(p_h + j, mask=m_c, other=0.0)
        acc += b_h.to(tl.float32) * tl.load(w + o_c * W + j, mask=m_c, other=0.0).to(tl.float32)
        if j > 0:
            # column j−1 was read in the previous tap: it takes column j
            tl.store(p_h + (j - 1), b_h, mask=m_c)
    b_x = tl.load(x + i_b * sxb + o_c, mask=m_c, other=0.0)
    acc += b_x.to(tl.float32) * tl.load(w + o_c * W + (W - 1), mask=m_c, other=0.0).to(tl.float32)
    tl.store(p_h + (W - 2), b_x.to(h.dtype.element_ty), mask=m_c)
    b_y = acc * tl.sigmoid(acc)
    if L2:
        b_y = b_y / tl.sqrt(tl.sum(b_y * b_y, axis=0) + _EPS)
    tl.store(y + i_b * C + o_c, b_y.to(y.dtype.element_ty), mask=m_c)


@triton.jit
def conv_silu_step_kernel(
    x0, h0, w0, b0, y0, C0, sx0, sh0b, sh0c, x1, h1, w1, b1, y1, C1, sx1, sh1b, sh1c, x2, h2, w2, b2, y2,
    C2, sx2, sh2b, sh2c,
    W: tl.constexpr, BC: tl.constexpr, HD: tl.constexpr, HB0: tl.constexpr, HB1: tl.constexpr,
    HB2: tl.constexpr, L2_0: tl.constexpr, L2_1: tl.constexpr, L2_2: tl.constexpr,
):  # fmt: skip
    """Grid (channel blocks of the widest conv, n ≤ 3 convs, B sequences); conv i's arguments are
    (x_i, h_i, w_i, b_i, y_i, C_i, batch stride of x_i, batch and channel strides of h_i); the
    arguments of absent convs repeat the last one's (their programs do not exist)."""
    i_c, seg, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    if seg == 0:
        _conv_step(x0, h0, w0, b0, y0, i_b, i_c, C0, sx0, sh0b, sh0c, W, BC, HD, HB0, L2_0)
    if seg == 1:
        _conv_step(x1, h1, w1, b1, y1, i_b, i_c, C1, sx1, sh1b, sh1c, W, BC, HD, HB1, L2_1)
    if seg == 2:
        _conv_step(x2, h2, w2, b2, y2, i_b, i_c, C2, sx2, sh2b, sh2c, W, BC, HD, HB2, L2_2)


def step_block(head_dims: list[int], channels: list[int]) -> tuple[int, int]:
    """(BC, HD): HD channels per program (the L2 head when any conv normalises, else up to 128)."""
    heads = {d for d in head_dims if d}
    HD = heads.pop() if heads else min(128, pow2(max(channels)))
    return pow2(HD), HD


def conv_silu_step_fwd(
    xs: list[Tensor], w2s: list[Tensor], biases: list[Tensor | None], hists: list[Tensor],
    head_dims: list[int],
) -> list[Tensor]:  # fmt: skip
    """xs `[B, C_i]` (unit channel stride), w2s `[C_i, W]` contiguous, hists `[B, C_i, W−1]` (unit
    time stride, x's dtype; updated in place) → ys `[B, C_i]` contiguous in x's dtype. The L2 head
    dims that are nonzero are equal."""
    n, B, W = len(xs), xs[0].shape[0], w2s[0].shape[1]
    channels = [x.shape[1] for x in xs]
    ys = [torch.empty(B, c, dtype=x.dtype, device=x.device) for x, c in zip(xs, channels)]
    BC, HD = step_block(head_dims, channels)
    if B == 0 or max(channels) == 0:
        return ys
    args = []
    for i in range(3):
        j = min(i, n - 1)
        x, h = xs[j], hists[j]
        args += [x, h, w2s[j], biases[j], ys[j], channels[j], x.stride(0), h.stride(0), h.stride(1)]
    flags = {f"HB{i}": biases[min(i, n - 1)] is not None for i in range(3)}
    flags |= {f"L2_{i}": head_dims[min(i, n - 1)] > 0 for i in range(3)}
    grid = (triton.cdiv(max(channels), HD), n, B)
    conv_silu_step_kernel[grid](*args, W=W, BC=BC, HD=HD, num_warps=STEP_WARPS, **flags)
    return ys
