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
* the four diagonal 16 x 16 blocks are formed elementwise in fp32 with e^{b_r − b_i}, r ≥ i, one
  column i at a time from row i of k and g loaded from memory (`diag16`).

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
    load_vec16,
    mm,
    rcumsum,
    rsum,
    stack4,
    store_lower64,
)


@helper
def load3(ptr, rows3, m3, ok, m_k, STRIDE: tl.constexpr):
    """`[4, 16, BK]` tile of a `[rows, STRIDE]` buffer at rows `rows3` `[4, 16, 1]`, columns `ok`."""
    p = ptr + rows3.to(tl.int64) * STRIDE + ok[None, None, :]
    return tl.load(p, mask=m3 & m_k[None, None, :], other=0.0).to(tl.float32)


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


@helper
def rows16(ptr, t0, I: tl.constexpr, eos, STRIDE: tl.constexpr, ok, m_k):
    """Rows t0 + 16 I .. +16, columns `ok`, of a `[rows, STRIDE]` buffer as fp32 `[16, BK]` (0 outside)."""
    rows = t0 + I * 16 + tl.arange(0, 16)
    p = ptr + rows.to(tl.int64)[:, None] * STRIDE + ok[None, :]
    return tl.load(p, mask=(rows < eos)[:, None] & m_k[None, :], other=0.0).to(tl.float32)


@helper
def sub_chunks(ptr, t0, eos, STRIDE: tl.constexpr, ok, m_k):
    """The chunk's four 16-row sub-chunks of a `[rows, STRIDE]` buffer (`rows16` of each)."""
    return (
        rows16(ptr, t0, 0, eos, STRIDE, ok, m_k),
        rows16(ptr, t0, 1, eos, STRIDE, ok, m_k),
        rows16(ptr, t0, 2, eos, STRIDE, ok, m_k),
        rows16(ptr, t0, 3, eos, STRIDE, ok, m_k),
    )


@helper
def store_rows16(ptr, x, t0, I: tl.constexpr, eos, STRIDE: tl.constexpr, ok, m_k):
    rows = t0 + I * 16 + tl.arange(0, 16)
    p = ptr + rows.to(tl.int64)[:, None] * STRIDE + ok[None, :]
    tl.store(p, x, mask=(rows < eos)[:, None] & m_k[None, :])


@helper
def token_row(pk, pg, row, eos, KS: tl.constexpr, GS: tl.constexpr, ok, m_k):
    """(g, k) of one token at channels ok, fp32 `[BK]` each (0 past eos)."""
    m = m_k & ((ok * 0 + row) < eos)  # a vector mask: the interpreter rejects a 0-d one
    g_i = tl.load(pg + row.to(tl.int64) * GS + ok, mask=m, other=0.0).to(tl.float32)
    k_i = tl.load(pk + row.to(tl.int64) * KS + ok, mask=m, other=0.0).to(tl.float32)
    return g_i, k_i


@helper
def diag_column(xq, xk, bI, b_i, k_i, i, Aq, Ak):
    """Column i of a sub-chunk's diagonal blocks: Σ_c x_rc k_ic e^{b_rc − b_ic} for q and k rows.

    Rows r < i get exponent 0 (finite); their entries are dropped by the caller's mask.
    """
    o = tl.arange(0, 16)
    ke = k_i[None, :] * tl.exp(tl.where(o[:, None] >= i, bI - b_i[None, :], 0.0))
    Aq = tl.where(o[None, :] == i, rsum(xq * ke, 1)[:, None], Aq)
    Ak = tl.where(o[None, :] == i, rsum(xk * ke, 1)[:, None], Ak)
    return Aq, Ak


@helper
def diag16(xq, xk, bI, c, pk, pg, t0, I: tl.constexpr, eos, KS: tl.constexpr, GS: tl.constexpr, ok, m_k):
    """Channel sums of q_r k_i e^{b_r − b_i} and k_r k_i e^{b_r − b_i} in sub-chunk I (`[16, 16]`,
    entries with r < i are junk, masked by the caller).

    Column i takes row i of k and g straight from memory and carries b_i as a running sum from c
    (b before the sub-chunk), so no row is extracted from a register tile (a cross-thread
    reduction per row: what made the first version of this kernel 6x slower than the peer's
    whole forward on the H200).
    """
    Aq = tl.zeros([16, 16], dtype=tl.float32)
    Ak = tl.zeros([16, 16], dtype=tl.float32)
    b_i = c
    for i in range(16):
        g_i, k_i = token_row(pk, pg, t0 + I * 16 + i, eos, KS, GS, ok, m_k)
        b_i += g_i
        Aq, Ak = diag_column(xq, xk, bI, b_i, k_i, i, Aq, Ak)
    return Aq, Ak


@helper
def diag16x4(
    x0, x1, x2, x3, k0, k1, k2, k3, b0, b1, b2, b3, c0, c1, c2, c3, pk, pg, t0, eos,
    KS: tl.constexpr, GS: tl.constexpr, ok, m_k,
):  # fmt: skip
    """`diag16` of the four sub-chunks in one column loop: step i does column i of all four, four
    independent bodies (the one-sub-chunk loop is 64 dependent steps per channel slice)."""
    z = tl.zeros([16, 16], dtype=tl.float32)
    A0, A1, A2, A3, K0, K1, K2, K3 = z, z, z, z, z, z, z, z
    r0, r1, r2, r3 = c0, c1, c2, c3
    for i in range(16):
        g_i, k_i = token_row(pk, pg, t0 + i, eos, KS, GS, ok, m_k)
        r0 += g_i
        A0, K0 = diag_column(x0, k0, b0, r0, k_i, i, A0, K0)
        g_i, k_i = token_row(pk, pg, t0 + 16 + i, eos, KS, GS, ok, m_k)
        r1 += g_i
        A1, K1 = diag_column(x1, k1, b1, r1, k_i, i, A1, K1)
        g_i, k_i = token_row(pk, pg, t0 + 32 + i, eos, KS, GS, ok, m_k)
        r2 += g_i
        A2, K2 = diag_column(x2, k2, b2, r2, k_i, i, A2, K2)
        g_i, k_i = token_row(pk, pg, t0 + 48 + i, eos, KS, GS, ok, m_k)
        r3 += g_i
        A3, K3 = diag_column(x3, k3, b3, r3, k_i, i, A3, K3)
    return A0, A1, A2, A3, K0, K1, K2, K3


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
    INTERLEAVE: tl.constexpr = False,
):
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    _, i_t, bos, eos = chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    t0 = bos + i_t * BT
    pq, pk = q + i_h * K, k + i_h * K
    pg, pgc = g + i_hv * K, gcum + i_hv * K
    be0 = load_vec16(beta + i_hv, t0, 0, eos, HV)
    be1 = load_vec16(beta + i_hv, t0, 1, eos, HV)
    be2 = load_vec16(beta + i_hv, t0, 2, eos, HV)
    be3 = load_vec16(beta + i_hv, t0, 3, eos, HV)

    z = tl.zeros([16, 16], dtype=tl.float32)
    d0, d1, d2, d3, e0, e1, e2, e3 = z, z, z, z, z, z, z, z
    q10, q20, q21, q30, q31, q32 = z, z, z, z, z, z
    a10, a20, a21, a30, a31, a32 = z, z, z, z, z, z
    for i_k in range(tl.cdiv(K, BK)):
        ok = i_k * BK + tl.arange(0, BK)
        m_k = ok < K
        # Chunk-local cumsum per sub-chunk plus the carry of the ones before; padded rows load
        # g = 0, so b stays at the chunk's last value there. c1..c3: b before sub-chunks 1..3,
        # the reference points of the off-diagonal blocks.
        g0 = rows16(pg, t0, 0, eos, HV * K, ok, m_k)
        g1 = rows16(pg, t0, 1, eos, HV * K, ok, m_k)
        g2 = rows16(pg, t0, 2, eos, HV * K, ok, m_k)
        g3 = rows16(pg, t0, 3, eos, HV * K, ok, m_k)
        c0 = tl.zeros([BK], dtype=tl.float32)
        c1 = rsum(g0, 0)
        c2 = c1 + rsum(g1, 0)
        c3 = c2 + rsum(g2, 0)
        b0 = rcumsum(g0, 0)
        b1 = rcumsum(g1, 0) + c1[None, :]
        b2 = rcumsum(g2, 0) + c2[None, :]
        b3 = rcumsum(g3, 0) + c3[None, :]
        store_rows16(pgc, b0, t0, 0, eos, HV * K, ok, m_k)
        store_rows16(pgc, b1, t0, 1, eos, HV * K, ok, m_k)
        store_rows16(pgc, b2, t0, 2, eos, HV * K, ok, m_k)
        store_rows16(pgc, b3, t0, 3, eos, HV * K, ok, m_k)
        x0 = rows16(pq, t0, 0, eos, H * K, ok, m_k)
        x1 = rows16(pq, t0, 1, eos, H * K, ok, m_k)
        x2 = rows16(pq, t0, 2, eos, H * K, ok, m_k)
        x3 = rows16(pq, t0, 3, eos, H * K, ok, m_k)
        k0 = rows16(pk, t0, 0, eos, H * K, ok, m_k)
        k1 = rows16(pk, t0, 1, eos, H * K, ok, m_k)
        k2 = rows16(pk, t0, 2, eos, H * K, ok, m_k)
        k3 = rows16(pk, t0, 3, eos, H * K, ok, m_k)

        if INTERLEAVE:
            A0, A1, A2, A3, K0, K1, K2, K3 = diag16x4(
                x0, x1, x2, x3, k0, k1, k2, k3, b0, b1, b2, b3, c0, c1, c2, c3, pk, pg, t0, eos,
                H * K, HV * K, ok, m_k,
            )  # fmt: skip
            d0 += A0
            d1 += A1
            d2 += A2
            d3 += A3
            e0 += K0
            e1 += K1
            e2 += K2
            e3 += K3
        else:
            dq_, dk_ = diag16(x0, k0, b0, c0, pk, pg, t0, 0, eos, H * K, HV * K, ok, m_k)
            d0 += dq_
            e0 += dk_
            dq_, dk_ = diag16(x1, k1, b1, c1, pk, pg, t0, 1, eos, H * K, HV * K, ok, m_k)
            d1 += dq_
            e1 += dk_
            dq_, dk_ = diag16(x2, k2, b2, c2, pk, pg, t0, 2, eos, H * K, HV * K, ok, m_k)
            d2 += dq_
            e2 += dk_
            dq_, dk_ = diag16(x3, k3, b3, c3, pk, pg, t0, 3, eos, H * K, HV * K, ok, m_k)
            d3 += dq_
            e3 += dk_

        q10 += off_block(x1, b1, c1, k0, b0, CT, DOT)
        a10 += off_block(k1, b1, c1, k0, b0, CT, DOT)
        q20 += off_block(x2, b2, c2, k0, b0, CT, DOT)
        a20 += off_block(k2, b2, c2, k0, b0, CT, DOT)
        q21 += off_block(x2, b2, c2, k1, b1, CT, DOT)
        a21 += off_block(k2, b2, c2, k1, b1, CT, DOT)
        q30 += off_block(x3, b3, c3, k0, b0, CT, DOT)
        a30 += off_block(k3, b3, c3, k0, b0, CT, DOT)
        q31 += off_block(x3, b3, c3, k1, b1, CT, DOT)
        a31 += off_block(k3, b3, c3, k1, b1, CT, DOT)
        q32 += off_block(x3, b3, c3, k2, b2, CT, DOT)
        a32 += off_block(k3, b3, c3, k2, b2, CT, DOT)

    o = tl.arange(0, 16)
    strict = o[:, None] > o[None, :]
    lower = o[:, None] >= o[None, :]
    Ad = stack4(
        tl.where(strict, e0 * be0[:, None], 0.0),
        tl.where(strict, e1 * be1[:, None], 0.0),
        tl.where(strict, e2 * be2[:, None], 0.0),
        tl.where(strict, e3 * be3[:, None], 0.0),
    )
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = inv_unit_lower64(
        Ad,
        a10 * be1[:, None],
        a20 * be2[:, None],
        a21 * be2[:, None],
        a30 * be3[:, None],
        a31 * be3[:, None],
        a32 * be3[:, None],
        DOT,
    )
    store_lower64(Ainv + i_hv * BT, t0, eos, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, HV, BT)
    store_lower64(
        Aqk + i_hv * BT,
        t0,
        eos,
        tl.where(lower, d0 * scale, 0.0),
        q10 * scale,
        tl.where(lower, d1 * scale, 0.0),
        q20 * scale,
        q21 * scale,
        tl.where(lower, d2 * scale, 0.0),
        q30 * scale,
        q31 * scale,
        q32 * scale,
        tl.where(lower, d3 * scale, 0.0),
        HV,
        BT,
    )
