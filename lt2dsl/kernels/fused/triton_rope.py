"""Triton kernel of half-split RoPE on the first R channels of each head of one or two tensors (q
and k) that share one table, in one launch (inference: no backward).

For x `[B, T, H, D]` and the table rows c, s `[B or 1, T, R]` (`lowering.functional.rope_rows`:
c = (cos, cos), s = (−sin, sin)), per head, in fp32:
    y[j] = x[j] · c[j] + x[(j + R/2) mod R] · s[j]   for j < R,      y[j] = x[j]   for j ≥ R,
rounded to x's dtype: what `naive.rope_ref` computes, the concatenation with the unrotated rest
(`dims < head_dim`, partial RoPE) included.

`rope_cache_kernel` is the decode step's form for attention layers (one token per row): q turned
into a new tensor, k turned and v copied straight into their cache buffers at each row's slot
(its position, or the position mod the ring's length), so the two cache writes need no launch of
their own. With NORM, k is first LayerNorm-ed over its D channels (weight, bias, eps; rounded to
k's dtype as the module's output is) before it turns: DSA's indexer key.

`xpos_fwd_kernel` is RetNet's interleaved-pair rotation (xPos without its scale) of one or two
tensors (q and k) at positions read from the device: pair (2j, 2j+1) of every head of the token at
position p turns by the angle whose cos and sin are row p, column j of the tables `[P, D/2]`
(`lowering.functional_recurrent.xpos_angles`, so the kernel's angles are the reference's bit for
bit), in fp32:
    y[2j] = x[2j] · cos − x[2j+1] · sin,      y[2j+1] = x[2j+1] · cos + x[2j] · sin,
rounded to x's dtype: what `naive.xpos_ref` computes. Gathering the rows in the kernel leaves a
decode step one launch for q and k together, and no per-step table launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lt2dsl.kernels.common.tl_util import cast

from .common import pow2

ROPE_WARPS = 4


@triton.jit
def _rope_tile(
    p_x, sxh, o_h, H, p_c, p_s, w, bias, eps, R: tl.constexpr, BD: tl.constexpr, D: tl.constexpr,
    NORM: tl.constexpr,
):  # fmt: skip
    """(y, mask): heads o_h of one token (head h at p_x + h·sxh) turned by the table row at p_c,
    p_s, in fp32; with NORM the LayerNorm of each head (`w`, `bias`, `eps`) first, in x's dtype."""
    o_d = tl.arange(0, BD)
    m = (o_h < H)[:, None] & (o_d < D)[None, :]
    p_x = p_x + o_h[:, None] * sxh
    b_x = tl.load(p_x + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    rot = o_d < R
    partner = tl.where(o_d < R // 2, o_d + R // 2, o_d - R // 2)
    b_p = tl.load(p_x + partner[None, :], mask=m & rot[None, :], other=0.0).to(tl.float32)
    if NORM:
        mean = tl.sum(b_x, axis=1) / D
        xc = tl.where(m, b_x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / D + eps)
        m_d = o_d < D
        b_w = tl.load(w + o_d, mask=m_d, other=0.0).to(tl.float32)
        b_b = tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
        b_wp = tl.load(w + partner, mask=m_d & rot, other=0.0).to(tl.float32)
        b_bp = tl.load(bias + partner, mask=m_d & rot, other=0.0).to(tl.float32)
        DT = p_x.dtype.element_ty
        b_x = cast(xc * rstd[:, None] * b_w[None, :] + b_b[None, :], DT).to(tl.float32)
        b_p = cast((b_p - mean[:, None]) * rstd[:, None] * b_wp[None, :] + b_bp[None, :], DT).to(tl.float32)
    b_c = tl.load(p_c + o_d, mask=rot, other=1.0).to(tl.float32)
    b_s = tl.load(p_s + o_d, mask=rot, other=0.0).to(tl.float32)
    return tl.where(rot[None, :], b_x * b_c[None, :] + b_p * b_s[None, :], b_x), m


@triton.jit
def _rope_rows(
    x, y, c, s, i_b, i_t, i_h, T, H, sxb, sxt, sxh, scb, sct, R: tl.constexpr, BH: tl.constexpr,
    BD: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Heads i_h·BH … of row (i_b, i_t) of one tensor."""
    o_h = i_h * BH + tl.arange(0, BH)
    o_d = tl.arange(0, BD)
    p_c = i_b * scb + i_t * sct
    b_y, m = _rope_tile(x + i_b * sxb + i_t * sxt, sxh, o_h, H, c + p_c, s + p_c, c, c, 0.0, R, BD, D, False)
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


@triton.jit
def rope_cache_kernel(
    q, yq, Hq, sqb, sqh, k, kc, Hk, skb, skh, kcb, kch, kcl, v, vc, svb, svh, vcb, vch, vcl, pos, L, c, s,
    scb, w, bias, eps, R: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, D: tl.constexpr,
    RING: tl.constexpr, NORM: tl.constexpr,
):  # fmt: skip
    """Grid (B rows, head blocks of the widest tensor, 2 or 3: q, k[, v]). Row b's one token: q's
    heads `[Hq, D]` turned into yq `[B, 1, Hq, D]`; k's `[Hk, D]` turned (LayerNorm-ed first with
    NORM) into kc[b, h, slot, :], v's copied into vc[b, h, slot, :] (cache strides batch, head,
    slot; unit channel stride), slot = pos[b] (mod L with RING)."""
    i_b, i_h, which = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    o_h = i_h * BH + tl.arange(0, BH)
    o_d = tl.arange(0, BD)
    p_c, p_s = c + i_b * scb, s + i_b * scb
    slot = tl.load(pos + i_b)
    if RING:
        slot = slot % L
    if which == 0:
        b_y, m = _rope_tile(q + i_b * sqb, sqh, o_h, Hq, p_c, p_s, w, bias, eps, R, BD, D, False)
        p_y = yq + (i_b * Hq + o_h[:, None]) * D + o_d[None, :]
        tl.store(p_y, b_y.to(yq.dtype.element_ty), mask=m)
    if which == 1:
        b_y, m = _rope_tile(k + i_b * skb, skh, o_h, Hk, p_c, p_s, w, bias, eps, R, BD, D, NORM)
        p_y = kc + i_b * kcb + slot * kcl + o_h[:, None] * kch + o_d[None, :]
        tl.store(p_y, b_y.to(kc.dtype.element_ty), mask=m)
    if which == 2:
        m = (o_h < Hk)[:, None] & (o_d < D)[None, :]
        b_v = tl.load(v + i_b * svb + o_h[:, None] * svh + o_d[None, :], mask=m, other=0.0)
        p_y = vc + i_b * vcb + slot * vcl + o_h[:, None] * vch + o_d[None, :]
        tl.store(p_y, b_v.to(vc.dtype.element_ty), mask=m)


def rope_cache_fwd(q, k, v, c, s, kc, vc, pos, ring: bool, norm: tuple | None) -> torch.Tensor:
    """q `[B, 1, Hq, D]`, k (and v) `[B, 1, Hk, D]` (unit channel strides); c, s `[B, R]` (one
    stride pattern, unit last); kc (and vc) `[B, Hk, L, D]` caches (unit channel stride) written at
    each row's slot; pos `[B]` int64; norm (weight, bias `[D]`, eps) or None → yq `[B, 1, Hq, D]`."""
    B, _, Hq, D = q.shape
    Hk, L = k.shape[2], kc.shape[2]
    R = c.shape[-1]
    yq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if B == 0:
        return yq
    BH, BD = rope_block(max(Hq, Hk), D)
    w, bias, eps = norm if norm is not None else (c, c, 0.0)
    # without v the grid has no third program: k's arguments stand in for v's
    vs = (k, kc, 0, 0, 0, 0, 0) if v is None else (v, vc, v.stride(0), v.stride(2), *vc.stride()[:3])
    grid = (B, triton.cdiv(max(Hq, Hk), BH), 3 if v is not None else 2)
    rope_cache_kernel[grid](
        q, yq, Hq, q.stride(0), q.stride(2), k, kc, Hk, k.stride(0), k.stride(2), kc.stride(0), kc.stride(1),
        kc.stride(2), *vs, pos, L, c, s, c.stride(0), w, bias, eps, R=R, BH=BH, BD=BD, D=D,
        RING=ring, NORM=norm is not None, num_warps=ROPE_WARPS,
    )  # fmt: skip
    return yq


@triton.jit
def _xpos_rows(
    x, y, c, s, p, i_b, i_t, i_h, T, H, sxb, sxt, sxh, BH: tl.constexpr, BD: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Heads i_h·BH … of row (i_b, i_t) of one tensor, turned by table row p."""
    o_h = i_h * BH + tl.arange(0, BH)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m = (o_h < H)[:, None] & m_d[None, :]
    p_x = x + i_b * sxb + i_t * sxt + o_h[:, None] * sxh
    b_x = tl.load(p_x + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    # D is even, so the partner 2j ↔ 2j+1 of a channel below D is below D too
    b_p = tl.load(p_x + (o_d ^ 1)[None, :], mask=m, other=0.0).to(tl.float32)
    b_c = tl.load(c + p * (D // 2) + o_d // 2, mask=m_d, other=1.0)
    b_s = tl.load(s + p * (D // 2) + o_d // 2, mask=m_d, other=0.0)
    b_s = tl.where(o_d % 2 == 0, -b_s, b_s)
    b_y = b_x * b_c[None, :] + b_p * b_s[None, :]
    p_y = y + ((i_b * T + i_t) * H + o_h[:, None]) * D + o_d[None, :]
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m)


@triton.jit
def xpos_fwd_kernel(
    x0, y0, H0, sx0b, sx0t, sx0h, x1, y1, H1, sx1b, sx1t, sx1h, c, s, pos, T, spb, spt,
    BH: tl.constexpr, BD: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """Grid (B · T rows, head blocks of the wider tensor, n ≤ 2 tensors); tensor i's arguments are
    (x_i, y_i, H_i and x_i's batch, time and head strides), a second tensor absent repeats the
    first's (its programs do not exist). Row (b, t) turns by table row pos[b · spb + t · spt]; the
    tables c, s are contiguous `[P, D/2]` fp32 and every position is below P."""
    row, i_h, which = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_t = (row // T).to(tl.int64), (row % T).to(tl.int64)
    p = tl.load(pos + i_b * spb + i_t * spt).to(tl.int64)
    if which == 0:
        _xpos_rows(x0, y0, c, s, p, i_b, i_t, i_h, T, H0, sx0b, sx0t, sx0h, BH, BD, D)
    if which == 1:
        _xpos_rows(x1, y1, c, s, p, i_b, i_t, i_h, T, H1, sx1b, sx1t, sx1h, BH, BD, D)


def xpos_fwd(
    xs: list[torch.Tensor], c: torch.Tensor, s: torch.Tensor, pos: torch.Tensor
) -> list[torch.Tensor]:
    """xs: one or two `[B, T, H_i, D]` (D even, unit channel stride); c, s contiguous `[P, D/2]`
    fp32; pos `[B, T]` or `[T]` integer rows of the tables, each below P → ys `[B, T, H_i, D]`
    contiguous in x_i's dtype."""
    B, T, _, D = xs[0].shape
    ys = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in xs]
    heads = max(x.shape[2] for x in xs)
    if B * T * heads * D == 0:
        return ys
    BH, BD = rope_block(heads, D)
    args = []
    for i in range(2):
        x, y = xs[min(i, len(xs) - 1)], ys[min(i, len(xs) - 1)]
        args += [x, y, x.shape[2], x.stride(0), x.stride(1), x.stride(2)]
    spb, spt = (pos.stride(0), pos.stride(1)) if pos.dim() == 2 else (0, pos.stride(0))
    grid = (B * T, triton.cdiv(heads, BH), len(xs))
    xpos_fwd_kernel[grid](*args, c, s, pos, T, spb, spt, BH=BH, BD=BD, D=D, num_warps=ROPE_WARPS)
    return ys
