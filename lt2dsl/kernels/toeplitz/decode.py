"""Triton decode step of the causal Toeplitz mixer: y_t over the cached inputs x_1..x_t, O(t) per token.

y_t[c] = b[head(c), t] + Σ_j Σ_{s < t} w^{(j)}_{head(c)}[t − 1 − s] x_cache[s, c − k + 1 + j] (0-based s).
The time axis is split across programs (SPLIT partial sums, added by one small reduction) so that
a long cache is read at full bandwidth even for batch 1; the kernel variant's channel window reads
neighbouring channels of the same cache rows, which stay in cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import new_empty

BLOCK_S, BLOCK_C = 64, 64


@triton.jit(do_not_specialize=["t", "n"])
def step_kernel(
    x, w, part, t, n, S_PER,
    C: tl.constexpr, CH: tl.constexpr, HEADS: tl.constexpr, KW: tl.constexpr,
    BS: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """part[split, b, c] = Σ over this split's cache rows of w[t − 1 − s] x[s, c − k + 1 + j]."""
    i_c, i_b, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    h = o_c // CH
    acc = tl.zeros([BC], dtype=tl.float32)
    s_lo = i_s * S_PER
    for s0 in range(s_lo, tl.minimum(s_lo + S_PER, t), BS):
        o_s = s0 + tl.arange(0, BS)
        m_s = o_s < tl.minimum(s_lo + S_PER, t)
        lag = t - 1 - o_s
        for j in tl.static_range(KW):
            c_x = o_c - KW + 1 + j
            m = m_s[:, None] & (m_c & (c_x >= 0))[None, :]
            p_x = x + (i_b.to(tl.int64) * t + o_s[:, None]) * C + c_x[None, :]
            b_x = tl.load(p_x, mask=m, other=0.0).to(tl.float32)
            b_w = tl.load(w + (j * HEADS + h[None, :]) * n + lag[:, None], mask=m, other=0.0).to(tl.float32)
            acc += tl.sum(b_x * b_w, axis=0)
    tl.store(part + (i_s * tl.num_programs(1) + i_b) * C + o_c, acc, mask=m_c)


def toeplitz_step_triton(x_cache: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y_t `[B, C]` (dtype of x_cache) for x_cache `[B, t, C]`, w `[kernel, heads, n]`, bias `[heads, n]`."""
    B, t, C = x_cache.shape
    kernel, heads, n = w.shape
    # enough programs to stream a long cache at full bandwidth, at least BLOCK_S rows each
    splits = max(1, min(64, t // (4 * BLOCK_S)))
    s_per = triton.cdiv(triton.cdiv(t, splits), BLOCK_S) * BLOCK_S
    splits = triton.cdiv(t, s_per)
    part = new_empty(x_cache, splits, B, C, dtype=torch.float32)
    grid = (triton.cdiv(C, BLOCK_C), B, splits)
    step_kernel[grid](
        x_cache.contiguous(), w.contiguous(), part, t, n, s_per,
        C=C, CH=C // heads, HEADS=heads, KW=kernel, BS=BLOCK_S, BC=BLOCK_C,
    )  # fmt: skip
    y = part.sum(0)
    if bias is not None:
        y = y + bias[:, t - 1].float().repeat_interleave(C // heads)[None, :]
    return y.to(x_cache.dtype)
