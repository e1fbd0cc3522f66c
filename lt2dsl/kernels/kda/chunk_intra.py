"""KDA chunk preparation: per-channel gate cumsum, T = (I + A)^{-1} and the gated scores Aqk.

With per-channel decay the intra-chunk products carry e^{b_rc − b_ic} inside the channel sum
(mixers.md §6 (b), (e)):

    Akk[r, i] = β_r Σ_c k_rc k_ic e^{b_rc − b_ic}   (r > i)
    Aqk[r, i] = s Σ_c q_rc k_ic e^{b_rc − b_ic}     (r ≥ i)

Splitting the factor as K ⊙ e^{−b} overflows once −b > 88, so each 64-chunk is cut into four
16-token sub-chunks:

* below the diagonal (query sub-chunk I after key sub-chunk J) the reference point is the
  cumulative decay at the last token before sub-chunk I, b* ≥ b_r (r ∈ I) and b* ≤ b_i (i ∈ J), so
  both factors (Q ⊙ e^{b − b*}) and (K ⊙ e^{b* − b}) are ≤ 1 and the block is one `tl.dot`;
* the four diagonal 16 x 16 blocks are formed elementwise in fp32 with e^{b_r − b_i}, r ≥ i, all
  four at once as `[4, 16, BK]` tensors.

Channels are walked in slices of BK (every quantity above is a sum over channels). One program per
(chunk, batch x value head) writes gcum `[B*T, HV, K]`, Ainv and Aqk `[B*T, HV, 64]` (fp32).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.delta_tl import (
    chunk_coords,
    helper,
    inv_unit_lower64,
    mm,
    pick4,
    rcumsum,
    rsum,
    store_lower64,
)


@helper
def load3(ptr, rows3, m3, ok, m_k, STRIDE: tl.constexpr):
    """`[4, 16, BK]` tile of a `[rows, STRIDE]` buffer at rows `rows3` `[4, 16, 1]`, columns `ok`."""
    p = ptr + rows3.to(tl.int64) * STRIDE + ok[None, None, :]
    return tl.load(p, mask=m3 & m_k[None, None, :], other=0.0).to(tl.float32)


@helper
def diag_blocks(q3, k3, b3):
    """Channel sums of q_r k_i e^{b_r − b_i} and k_r k_i e^{b_r − b_i} for r ≥ i in each sub-chunk.

    Returns two `[4, 16, 16]` stacks (rows r, columns i, lower with diagonal); column i is built
    from row i of k and b, with the exponent masked to 0 above the diagonal before `exp`.
    """
    o = tl.arange(0, 16)
    row = o[None, :, None]
    col = o[None, None, :]
    Aqk = tl.zeros([4, 16, 16], dtype=tl.float32)
    Akk = tl.zeros([4, 16, 16], dtype=tl.float32)
    for j in tl.static_range(16):
        k_j = rsum(tl.where(row == j, k3, 0.0), 1)  # [4, BK]
        b_j = rsum(tl.where(row == j, b3, 0.0), 1)
        e = tl.exp(tl.where(row >= j, b3 - b_j[:, None, :], 0.0))
        kj_e = k_j[:, None, :] * e
        Aqk += tl.where(col == j, rsum(q3 * kj_e, 2)[:, :, None], 0.0)
        Akk += tl.where(col == j, rsum(k3 * kj_e, 2)[:, :, None], 0.0)
    return Aqk, Akk


@helper
def last_row16(x):
    """Row 15 of a `[16, N]` tile."""
    return rsum(tl.where(tl.arange(0, 16)[:, None] == 15, x, 0.0), 0)


@helper
def off_block(xI, bI, refI, kJ, bJ, CT: tl.constexpr, DOT: tl.constexpr):
    """Σ_c x_rc k_ic e^{b_rc − b_ic} for r in sub-chunk I, i in an earlier sub-chunk J `[16, 16]`."""
    xs = (xI * tl.exp(bI - refI[None, :])).to(CT)
    ks = (kJ * tl.exp(refI[None, :] - bJ)).to(CT)
    return mm(xs, tl.trans(ks), DOT)


@triton.jit
def kda_intra_fwd_kernel(
    q,
    k,
    g,
    beta,
    gcum,
    Ainv,
    Aqk,
    cu_seqlens,
    chunk_indices,
    T,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr,
    CT: tl.constexpr,
):
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    _, i_t, bos, eos = chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    t0 = bos + i_t * BT
    o = tl.arange(0, 16)
    rows3 = t0 + 16 * tl.arange(0, 4)[:, None, None] + o[None, :, None]  # [4, 16, 1]
    m3 = rows3 < eos
    beta3 = tl.load(beta + rows3.to(tl.int64) * HV + i_hv, mask=m3, other=0.0).to(tl.float32)

    Aqk_d = tl.zeros([4, 16, 16], dtype=tl.float32)
    Akk_d = tl.zeros([4, 16, 16], dtype=tl.float32)
    q10 = tl.zeros([16, 16], dtype=tl.float32)
    q20, q21, q30, q31, q32 = q10, q10, q10, q10, q10
    a10, a20, a21, a30, a31, a32 = q10, q10, q10, q10, q10, q10
    for i_k in range(tl.cdiv(K, BK)):
        ok = i_k * BK + tl.arange(0, BK)
        m_k = ok < K
        q3 = load3(q + i_h * K, rows3, m3, ok, m_k, H * K)
        k3 = load3(k + i_h * K, rows3, m3, ok, m_k, H * K)
        # Chunk-local cumsum over the 64 rows (a scan along axis 0 of a 2-D tile), then viewed as
        # four sub-chunks; padded rows load g = 0, so b stays at the chunk's last value there.
        rows = t0 + tl.arange(0, BT)
        p_g = (rows.to(tl.int64)[:, None] * HV + i_hv) * K + ok[None, :]
        m_g = (rows < eos)[:, None] & m_k[None, :]
        b2 = rcumsum(tl.load(g + p_g, mask=m_g, other=0.0).to(tl.float32), 0)
        tl.store(gcum + p_g, b2, mask=m_g)
        b3 = tl.reshape(b2, (4, 16, BK))
        dq3, dk3 = diag_blocks(q3, k3, b3)
        Aqk_d += dq3
        Akk_d += dk3

        q1, q2, q3_ = pick4(q3, 1), pick4(q3, 2), pick4(q3, 3)
        k0, k1, k2, k3_ = pick4(k3, 0), pick4(k3, 1), pick4(k3, 2), pick4(k3, 3)
        b0, b1, b2, b3_ = pick4(b3, 0), pick4(b3, 1), pick4(b3, 2), pick4(b3, 3)
        # Reference points: b at the last token before sub-chunks 1, 2, 3.
        c1, c2, c3 = last_row16(b0), last_row16(b1), last_row16(b2)
        q10 += off_block(q1, b1, c1, k0, b0, CT, DOT)
        a10 += off_block(k1, b1, c1, k0, b0, CT, DOT)
        q20 += off_block(q2, b2, c2, k0, b0, CT, DOT)
        a20 += off_block(k2, b2, c2, k0, b0, CT, DOT)
        q21 += off_block(q2, b2, c2, k1, b1, CT, DOT)
        a21 += off_block(k2, b2, c2, k1, b1, CT, DOT)
        q30 += off_block(q3_, b3_, c3, k0, b0, CT, DOT)
        a30 += off_block(k3_, b3_, c3, k0, b0, CT, DOT)
        q31 += off_block(q3_, b3_, c3, k1, b1, CT, DOT)
        a31 += off_block(k3_, b3_, c3, k1, b1, CT, DOT)
        q32 += off_block(q3_, b3_, c3, k2, b2, CT, DOT)
        a32 += off_block(k3_, b3_, c3, k2, b2, CT, DOT)

    row, col = o[None, :, None], o[None, None, :]
    Akk_d = tl.where(row > col, Akk_d * beta3, 0.0)
    Aqk_d = tl.where(row >= col, Aqk_d * scale, 0.0)
    be1 = rsum(tl.where(tl.arange(0, 4)[:, None, None] == 1, beta3, 0.0), 0)  # [16, 1]
    be2 = rsum(tl.where(tl.arange(0, 4)[:, None, None] == 2, beta3, 0.0), 0)
    be3 = rsum(tl.where(tl.arange(0, 4)[:, None, None] == 3, beta3, 0.0), 0)
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = inv_unit_lower64(
        Akk_d, a10 * be1, a20 * be2, a21 * be2, a30 * be3, a31 * be3, a32 * be3, DOT
    )
    store_lower64(Ainv + i_hv * BT, t0, eos, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, HV, BT)
    store_lower64(
        Aqk + i_hv * BT,
        t0,
        eos,
        pick4(Aqk_d, 0),
        q10 * scale,
        pick4(Aqk_d, 1),
        q20 * scale,
        q21 * scale,
        pick4(Aqk_d, 2),
        q30 * scale,
        q31 * scale,
        q32 * scale,
        pick4(Aqk_d, 3),
        HV,
        BT,
    )
