"""Tile helpers of the delta-rule kernels: masked loads and stores of 2-D tiles, the chunk's gate.

Tiles are addressed in the flattened `[B*T, heads, D]` layout (`helpers`' conventions): row r0.. of
a buffer whose rows are STRIDE elements apart. The transposed forms read and write through
transposed pointers, so no tile is transposed in registers.
"""

from __future__ import annotations

import triton.language as tl

from lt2dsl.kernels.common.tl_util import cast, helper


@helper
def tile_at(
    base, r0, n_rows, STRIDE: tl.constexpr, c0, D: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
    TRANSPOSED: tl.constexpr,
):  # fmt: skip
    """(pointers, mask) of the `load_tile` tile, `[BR, BC]` or, TRANSPOSED, `[BC, BR]`: rows ≥ n_rows
    masked, columns ≥ D masked only when D is not a multiple of BC (so the access stays vectorised)."""
    orow = r0 + tl.arange(0, BR)
    ocol = c0 + tl.arange(0, BC)
    if TRANSPOSED:
        p = base + orow[None, :] * STRIDE + ocol[:, None]
        m = (orow < n_rows)[None, :]
        if D % BC != 0:
            m = m & (ocol < D)[:, None]
    else:
        p = base + orow[:, None] * STRIDE + ocol[None, :]
        m = (orow < n_rows)[:, None]
        if D % BC != 0:
            m = m & (ocol < D)[None, :]
    return p, m


# The default of the tile helpers' TRANSPOSED parameter: a `tl.constexpr`, as Triton 3.6 requires of
# a constexpr parameter's default (see `tl_util.NO_CACHE_MODIFIER`).
UNTRANSPOSED = tl.constexpr(False)


@helper
def load_tile(
    base, r0, n_rows, STRIDE: tl.constexpr, c0, D: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
    TRANSPOSED: tl.constexpr = UNTRANSPOSED,
):  # fmt: skip
    """`[BR, BC]` tile at rows r0.., columns c0.. of a `[rows, STRIDE]` buffer starting at `base`.

    Rows ≥ n_rows and columns ≥ D read 0. Offsets are int32 relative to the (int64) scalar base;
    when D is a multiple of BC only the rows are masked, which keeps the loads vectorised.
    TRANSPOSED: the tile transposed, `[BC, BR]`, read through transposed pointers (no tile is
    transposed in registers).
    """
    p, m = tile_at(base, r0, n_rows, STRIDE, c0, D, BR, BC, TRANSPOSED)
    return tl.load(p, mask=m, other=0.0)


@helper
def store_tile(
    base, x, r0, n_rows, STRIDE: tl.constexpr, c0, D: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
    TRANSPOSED: tl.constexpr = UNTRANSPOSED,
):  # fmt: skip
    """Store `x` `[BR, BC]` where `load_tile` reads (same masks), cast to the buffer's dtype;
    TRANSPOSED: store `x` `[BC, BR]` transposed there."""
    p, m = tile_at(base, r0, n_rows, STRIDE, c0, D, BR, BC, TRANSPOSED)
    tl.store(p, cast(x, base.dtype.element_ty), mask=m)


@helper
def load_chunk_gate(
    gcum, t0, eos, i_hv,
    HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, GATE: tl.constexpr,
):  # fmt: skip
    """(b `[BT]` or `[BT, BK]`, b_last `[1]` or `[BK]`) of one chunk; rows past eos hold b_last.

    Holding b_last on padded rows keeps every e^{b_r − b_i} with r ≥ i at most 1 there too.
    """
    ot = tl.arange(0, BT)
    rows = t0 + ot
    m_t = rows < eos
    last = tl.minimum(t0 + BT, eos) - 1
    if GATE == 1:
        b_last = tl.load(gcum + last.to(tl.int64) * HV + i_hv + tl.zeros([1], dtype=tl.int32))
        b = tl.load(gcum + rows.to(tl.int64) * HV + i_hv, mask=m_t, other=0.0)
        b = tl.where(m_t, b, b_last)
    else:
        ok = tl.arange(0, BK)
        b_last = tl.load(gcum + (last.to(tl.int64) * HV + i_hv) * K + ok, mask=ok < K, other=0.0)
        p = gcum + (rows.to(tl.int64)[:, None] * HV + i_hv) * K + ok[None, :]
        b = tl.load(p, mask=m_t[:, None] & (ok < K)[None, :], other=0.0)
        b = tl.where(m_t[:, None], b, b_last[None, :])
    return b, b_last


@helper
def gate_factors(b, b_last, GATE: tl.constexpr):
    """(γ, e^{b_C − b}, γ_C): `[BT]`, `[BT]`, `[1]` for a scalar gate; `[BT, BK]`, `[BT, BK]`, `[BK, 1]`
    for a per-channel one. Scalar factors scale dot results or `[BT, BV]` operands (no scaled
    copy of K is formed); per-channel ones must scale K itself."""
    if GATE == 1:
        gam = tl.exp(b)
        to_end = tl.exp(b_last - b)
        gam_c = tl.exp(b_last)[:, None]  # [1, 1]
    else:
        gam = tl.exp(b)
        to_end = tl.exp(b_last[None, :] - b)
        gam_c = tl.exp(b_last)[:, None]  # [BK, 1]
    return gam, to_end, gam_c


@helper
def load_square(ptr, t0, eos, i_hv, HV: tl.constexpr, BT: tl.constexpr, TRANSPOSED: tl.constexpr):
    """The chunk's `[BT, BT]` fp32 matrix from a `[B*T, HV, BT]` buffer (or its transpose)."""
    ot = tl.arange(0, BT)
    base = ptr + (t0.to(tl.int64) * HV + i_hv) * BT
    x = tl.load(base + ot[:, None] * (HV * BT) + ot[None, :], mask=(t0 + ot < eos)[:, None], other=0.0)
    if TRANSPOSED:
        x = tl.trans(x)
    return x
