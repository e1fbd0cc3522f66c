"""Triton kernel of half-split RoPE on the first R channels of each head of one or two tensors (q
and k) that share one table, in one launch (inference: no backward).

For x `[B, T, H, D]` and the table rows c, s `[B or 1, T, R]` (`lowering.functional.rope_rows`:
c = (cos, cos), s = (−sin, sin)), per head, in fp32:
    y[j] = x[j] · c[j] + x[(j + R/2) mod R] · s[j]   for j < R,      y[j] = x[j]   for j ≥ R,
rounded to x's dtype: what `naive.rope_ref` computes, the concatenation with the unrotated rest
(`dims < head_dim`, partial RoPE) included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import pow2

ROPE_WARPS = 4


@triton.jit
def _rope_rows(
    x, y, c, s, i_b, i_t, i_h, T, H, sxb, sxt, sxh, scb, sct, R: tl.constexpr, BH: tl.constexpr,
    BD: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Heads i_h·BH … of row (i_b, i_t) of one tensor."""
    o_h = i_h * BH + tl.arange(0, BH)
    o_d = tl.arange(0, BD)
    m = (o_h < H)[:, None] & (o_d < D)[None, :]
    p_x = x + i_b * sxb + i_t * sxt + o_h[:, None] * sxh
    b_x = tl.load(p_x + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    rot = o_d < R
    partner = tl.where(o_d < R // 2, o_d + R // 2, o_d - R // 2)
    b_p = tl.load(p_x + partner[None, :], mask=m & rot[None, :], other=0.0).to(tl.float32)
    p_c = i_b * scb + i_t * sct + o_d
    b_c = tl.load(c + p_c, mask=rot, other=1.0).to(tl.float32)
    b_s = tl.load(s + p_c, mask=rot, other=0.0).to(tl.float32)
    b_y = tl.where(rot[None, :], b_x * b_c[None, :] + b_p * b_s[None, :], b_x)
    p_y = y + ((i_b * T + i_t) * H + o_h[:, None]) * D + o_d[None, :]
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m)


@triton.jit
def rope_fwd_kernel(
    x0, y0, H0, sx0b, sx0t, sx0h, x1, y1, H1, sx1b, sx1t, sx1h, c, s, T, scb, sct,
    R: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Grid (B · T rows, head blocks of the wider tensor, n ≤ 2 tensors); tensor i's arguments
    are (x_i, y_i, H_i and x_i's batch, time and head strides); a second tensor absent repeats the
    first's (its programs do not exist)."""
    row, i_h, which = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_t = (row // T).to(tl.int64), (row % T).to(tl.int64)
    if which == 0:
        _rope_rows(x0, y0, c, s, i_b, i_t, i_h, T, H0, sx0b, sx0t, sx0h, scb, sct, R, BH, BD, D)
    if which == 1:
        _rope_rows(x1, y1, c, s, i_b, i_t, i_h, T, H1, sx1b, sx1t, sx1h, scb, sct, R, BH, BD, D)


def rope_block(heads: int, D: int) -> tuple[int, int]:
    """(BH, BD): heads per program (a tile of at most 4096 elements) and the padded head dim."""
    BD = pow2(D)
    return max(1, min(pow2(heads), 4096 // BD)), BD


def rope_fwd(xs: list[torch.Tensor], c: torch.Tensor, s: torch.Tensor) -> list[torch.Tensor]:
    """xs: one or two `[B, T, H_i, D]` (unit channel stride); c, s `[B or 1, T, R]` (unit last
    stride, one stride pattern) → ys `[B, T, H_i, D]` contiguous in x_i's dtype."""
    B, T, _, D = xs[0].shape
    R = c.shape[-1]
    ys = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in xs]
    heads = max(x.shape[2] for x in xs)
    if B * T * heads * D == 0:
        return ys
    BH, BD = rope_block(heads, D)
    args = []
    for i in range(2):
        x, y = xs[min(i, len(xs) - 1)], ys[min(i, len(xs) - 1)]
        args += [x, y, x.shape[2], x.stride(0), x.stride(1), x.stride(2)]
    scb = c.stride(0) if c.shape[0] > 1 else 0
    grid = (B * T, triton.cdiv(heads, BH), len(xs))
    rope_fwd_kernel[grid](*args, c, s, T, scb, c.stride(1), R=R, BH=BH, BD=BD, D=D, num_warps=ROPE_WARPS)
    return ys
