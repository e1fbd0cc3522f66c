"""Chunk preparation for DeltaNet / GDN: gate cumulative sums and the UT transform T = (I + A)^{-1}.

One program per (chunk, batch x value head). With b the chunk-local cumulative log decay (fp32) and
A[r, i] = β_r (k_r · k_i) e^{b_r − b_i} for r > i (mixers.md §5 (b) step 1), `delta_wy_rows_kernel`
stores

* gcum `[B*T, HV]` fp32: b (GDN only),
* Ainv `[B*T, HV, 64]` fp32: T = (I + A)^{-1}, row r of a chunk at that chunk's token r.

The scans form U' = T Diag(β)(V − Diag(γ) K S) per chunk on the fly, and P from Q and K (`scan`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.delta.helpers import (
    chunk_head,
    helper,
    inv_block_lower64,
    mm,
    rcumsum,
    rsum,
    store_lower64,
)
from lt2dsl.kernels.delta.tiles import load_tile


@helper
def _scratch_block(base, I: tl.constexpr, J: tl.constexpr, n, HV: tl.constexpr, BT: tl.constexpr):
    """Block (I, J) `[16, 16]` of the chunk's matrix in the scratch rows at `base` (0 past n)."""
    o = tl.arange(0, 16)
    rows = I * 16 + o
    return tl.load(
        base + rows[:, None] * (HV * BT) + J * 16 + o[None, :], mask=(rows < n)[:, None], other=0.0
    )


@triton.jit
def delta_wy_rows_kernel(
    k, g, beta, gcum, Ainv, cu_seqlens, chunk_indices, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """T = (I + A)^{-1} with A from one `[64, K]` dot, parked in Ainv's rows as scratch.

    The substitution for the diagonal blocks then loads row i of each block from there, one load
    per step where extracting it from a register tile takes two cross-thread reductions.
    The blocks below the diagonal are loaded from the scratch as well. Barriers order the scratch
    writes, reads and the final T over Ainv within the program.
    """
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_hv, i_h, i_t, bos, eos, _ = chunk_head(i_c, i_bh, cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    t0 = bos + i_t * BT
    n = eos - t0
    t64 = t0.to(tl.int64)
    ot = tl.arange(0, BT)
    m_t = ot < n
    b_beta = tl.load(beta + (t64 + ot) * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    b_k = load_tile(k + (t64 * H + i_h) * K, 0, n, H * K, 0, K, BT, BK)
    strict = ot[:, None] > ot[None, :]
    A = mm(b_k, tl.trans(b_k), DOT) * b_beta[:, None]
    if USE_G:
        # Padded rows load g = 0, so b stays at the chunk's last value there.
        b = rcumsum(tl.load(g + (t64 + ot) * HV + i_hv, mask=m_t, other=0.0).to(tl.float32), 0)
        tl.store(gcum + (t64 + ot) * HV + i_hv, b, mask=m_t)
        # kept entries have r > i, so the exponent is ≤ 0; the others are zeroed before exp
        A = A * tl.exp(tl.where(strict, b[:, None] - b[None, :], 0.0))
    A = tl.where(strict, A, 0.0)
    base = Ainv + (t64 * HV + i_hv) * BT
    tl.store(base + ot[:, None] * (HV * BT) + ot[None, :], A, mask=m_t[:, None])
    tl.debug_barrier()

    # Diagonal blocks, all four at once: R = T − I row by row, R_i = a + a R with a = −A_i (row i).
    o16 = tl.arange(0, 16)
    blk = tl.arange(0, 4)
    diag = (
        base + (16 * blk)[:, None, None] * (HV * BT + 1) + o16[None, :, None] * (HV * BT) + o16[None, None, :]
    )
    in_seq = (16 * blk[:, None, None] + o16[None, :, None]) < n
    R = -tl.load(diag, mask=in_seq, other=0.0)
    row = o16[None, :, None]
    for i in tl.static_range(2, 16):
        p_row = base + (16 * blk + i)[:, None] * (HV * BT) + 16 * blk[:, None] + o16[None, :]
        a = -tl.load(p_row, mask=((16 * blk + i) < n)[:, None], other=0.0)
        a = a + rsum(a[:, :, None] * R, 1)
        R = tl.where(row == i, a[:, None, :], R)
    Td = R + tl.where(o16[:, None] == o16[None, :], 1.0, 0.0)[None, :, :]
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = inv_block_lower64(
        Td,
        _scratch_block(base, 1, 0, n, HV, BT),
        _scratch_block(base, 2, 0, n, HV, BT),
        _scratch_block(base, 2, 1, n, HV, BT),
        _scratch_block(base, 3, 0, n, HV, BT),
        _scratch_block(base, 3, 1, n, HV, BT),
        _scratch_block(base, 3, 2, n, HV, BT),
        DOT,
    )
    tl.debug_barrier()
    store_lower64(Ainv + i_hv * BT, t0, eos, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, HV, BT)
