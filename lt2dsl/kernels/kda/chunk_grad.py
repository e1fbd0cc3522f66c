"""KDA's gated intra-chunk gradients, after the shared per-chunk kernels of `common/delta_grad`.

Those leave (per chunk and value head) dq, dk, db for every term that touches the state, dv, dβ
parts, and the scratch matrices dAqk = dO U'ᵀ (r ≥ i) and dA = −Y U'ᵀ (r > i). With b the
per-channel cumulative log decay, this kernel adds the terms of the gated scores
Aqk[r, i] = s Σ_c q_rc k_ic e^{b_rc − b_ic} and Akk[r, i] = β_r Σ_c k_rc k_ic e^{b_rc − b_ic}:

    dq_r += s Σ_{i≤r} dAqk_ri k_i e^{b_r − b_i}            Z_r = Σ_{i<r} dA_ri k_i e^{b_r − b_i}
    dk_i += s Σ_{r≥i} dAqk_ri q_r e^{b_r − b_i} + Σ_{r>i} β_r dA_ri k_r e^{b_r − b_i} + β_i Z_i
    db   += q ⊙ (intra dq) − k ⊙ (the two column sums above) + k ⊙ β Z,   dβ += Σ_c k ⊙ Z

then dg = reverse cumulative sum of db inside the chunk. Each channel is independent, so programs
tile K. The gated products use the 16-token sub-chunks and reference points of `chunk_intra`, so
every exponent stays ≤ 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.delta_tl import chunk_coords, helper, mm, pick4, rcumsum, rsum, stack4
from lt2dsl.kernels.kda.chunk_intra import last_row16, load3


@helper
def load_m(
    M,
    t0,
    eos,
    i_hv,
    I: tl.constexpr,
    J: tl.constexpr,
    HV: tl.constexpr,
    BT: tl.constexpr,
    TRANSPOSED: tl.constexpr,
):
    """Block (I, J) of a chunk's `[BT, BT]` scratch matrix as `[16, 16]` (or its transpose)."""
    o = tl.arange(0, 16)
    rows = t0 + I * 16 + o
    base = M + i_hv * BT + J * 16
    if TRANSPOSED:
        x = tl.load(
            base + rows.to(tl.int64)[None, :] * (HV * BT) + o[:, None], mask=(rows < eos)[None, :], other=0.0
        )
    else:
        x = tl.load(
            base + rows.to(tl.int64)[:, None] * (HV * BT) + o[None, :], mask=(rows < eos)[:, None], other=0.0
        )
    return x


@helper
def diag_grads(q3, k3, b3, beta3, MA3, MB3):
    """Intra-sub-chunk parts of (dq / s, Z, dk_from_Aqk / s, dk_from_Akk) as `[4, 16, BK]` stacks.

    Row forms walk the key column j, column forms the query row j; exponents are masked to 0 on
    the side of the diagonal where the (already zero) scratch entries would make them positive.
    """
    o = tl.arange(0, 16)
    row = o[None, :, None]
    col = o[None, None, :]
    dq3 = tl.zeros(q3.shape, dtype=tl.float32)
    z3 = tl.zeros(q3.shape, dtype=tl.float32)
    dka3 = tl.zeros(q3.shape, dtype=tl.float32)
    dkb3 = tl.zeros(q3.shape, dtype=tl.float32)
    for j in tl.static_range(16):
        k_j = rsum(tl.where(row == j, k3, 0.0), 1)[:, None, :]  # [4, 1, BK]
        q_j = rsum(tl.where(row == j, q3, 0.0), 1)[:, None, :]
        b_j = rsum(tl.where(row == j, b3, 0.0), 1)[:, None, :]
        beta_j = rsum(tl.where(row == j, beta3, 0.0), 1)[:, None, :]  # [4, 1, 1]
        e_r = tl.exp(tl.where(row >= j, b3 - b_j, 0.0))  # rows r ≥ j against key j
        e_c = tl.exp(tl.where(row <= j, b_j - b3, 0.0))  # keys i ≤ j against query row j
        ma_c = rsum(tl.where(col == j, MA3, 0.0), 2)[:, :, None]  # column j: [4, 16, 1]
        mb_c = rsum(tl.where(col == j, MB3, 0.0), 2)[:, :, None]
        ma_r = rsum(tl.where(row == j, MA3, 0.0), 1)[:, :, None]  # row j, indexed by column
        mb_r = rsum(tl.where(row == j, MB3, 0.0), 1)[:, :, None]
        dq3 += ma_c * k_j * e_r
        z3 += mb_c * k_j * e_r
        dka3 += ma_r * q_j * e_c
        dkb3 += mb_r * beta_j * k_j * e_c
    return dq3, z3, dka3, dkb3


@helper
def off_grads(MA, MB, MAt, MBt, qI, kI, bI, betaI, ref, kJ, bJ, CT: tl.constexpr, DOT: tl.constexpr):
    """Contributions of block (I, J), I > J, to (dq_I / s, Z_I, dk_J from Aqk / s, dk_J from Akk).

    `ref` is the cumulative decay at the token before sub-chunk I: e^{b_I − ref} and e^{ref − b_J}
    are both ≤ 1. MAt, MBt are the blocks loaded transposed (no dot result is transposed).
    """
    eI = tl.exp(bI - ref[None, :])
    eJ = tl.exp(ref[None, :] - bJ)
    kJs = (kJ * eJ).to(CT)
    dq = eI * mm(MA.to(CT), kJs, DOT)
    z = eI * mm(MB.to(CT), kJs, DOT)
    dka = eJ * mm(MAt.to(CT), (qI * eI).to(CT), DOT)
    dkb = eJ * mm((MBt * betaI[None, :]).to(CT), (kI * eI).to(CT), DOT)
    return dq, z, dka, dkb


@triton.jit
def kda_grad_intra_kernel(
    q,
    k,
    gcum,
    beta,
    MA,
    MB,
    dq,
    dk,
    dg,
    dbeta_intra,
    cu_seqlens,
    chunk_indices,
    T,
    R,
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
    i_k, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    _, i_t, bos, eos = chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    t0 = bos + i_t * BT
    o = tl.arange(0, 16)
    i4 = tl.arange(0, 4)[:, None, None]
    rows3 = t0 + 16 * i4 + o[None, :, None]  # [4, 16, 1]
    m3 = rows3 < eos
    ok = i_k * BK + tl.arange(0, BK)
    m_k = ok < K
    q3 = load3(q + i_h * K, rows3, m3, ok, m_k, H * K)
    k3 = load3(k + i_h * K, rows3, m3, ok, m_k, H * K)
    b3 = load3(gcum + i_hv * K, rows3, m3, ok, m_k, HV * K)
    last = tl.minimum(t0 + BT, eos) - 1
    b_last = tl.load(gcum + (last.to(tl.int64) * HV + i_hv) * K + ok, mask=m_k, other=0.0)
    # Padded rows hold the chunk's last decay, so no exponent turns positive there.
    b3 = tl.where(m3, b3, b_last[None, None, :])
    beta3 = tl.load(beta + rows3.to(tl.int64) * HV + i_hv, mask=m3, other=0.0).to(tl.float32)
    p_m = (rows3.to(tl.int64) * HV + i_hv) * BT + 16 * i4 + o[None, None, :]
    dq3, z3, dka3, dkb3 = diag_grads(
        q3, k3, b3, beta3, tl.load(MA + p_m, mask=m3, other=0.0), tl.load(MB + p_m, mask=m3, other=0.0)
    )

    q1, q2 = pick4(q3, 1), pick4(q3, 2)
    q3_ = pick4(q3, 3)
    k0, k1, k2 = pick4(k3, 0), pick4(k3, 1), pick4(k3, 2)
    k3_ = pick4(k3, 3)
    b0, b1, b2 = pick4(b3, 0), pick4(b3, 1), pick4(b3, 2)
    b3_ = pick4(b3, 3)
    be1 = rsum(pick4(beta3, 1), 1)
    be2 = rsum(pick4(beta3, 2), 1)
    be3 = rsum(pick4(beta3, 3), 1)
    c1, c2, c3 = last_row16(b0), last_row16(b1), last_row16(b2)
    dq10, z10, dka10, dkb10 = off_grads(
        load_m(MA, t0, eos, i_hv, 1, 0, HV, BT, False),
        load_m(MB, t0, eos, i_hv, 1, 0, HV, BT, False),
        load_m(MA, t0, eos, i_hv, 1, 0, HV, BT, True),
        load_m(MB, t0, eos, i_hv, 1, 0, HV, BT, True),
        q1,
        k1,
        b1,
        be1,
        c1,
        k0,
        b0,
        CT,
        DOT,
    )
    dq20, z20, dka20, dkb20 = off_grads(
        load_m(MA, t0, eos, i_hv, 2, 0, HV, BT, False),
        load_m(MB, t0, eos, i_hv, 2, 0, HV, BT, False),
        load_m(MA, t0, eos, i_hv, 2, 0, HV, BT, True),
        load_m(MB, t0, eos, i_hv, 2, 0, HV, BT, True),
        q2,
        k2,
        b2,
        be2,
        c2,
        k0,
        b0,
        CT,
        DOT,
    )
    dq21, z21, dka21, dkb21 = off_grads(
        load_m(MA, t0, eos, i_hv, 2, 1, HV, BT, False),
        load_m(MB, t0, eos, i_hv, 2, 1, HV, BT, False),
        load_m(MA, t0, eos, i_hv, 2, 1, HV, BT, True),
        load_m(MB, t0, eos, i_hv, 2, 1, HV, BT, True),
        q2,
        k2,
        b2,
        be2,
        c2,
        k1,
        b1,
        CT,
        DOT,
    )
    dq30, z30, dka30, dkb30 = off_grads(
        load_m(MA, t0, eos, i_hv, 3, 0, HV, BT, False),
        load_m(MB, t0, eos, i_hv, 3, 0, HV, BT, False),
        load_m(MA, t0, eos, i_hv, 3, 0, HV, BT, True),
        load_m(MB, t0, eos, i_hv, 3, 0, HV, BT, True),
        q3_,
        k3_,
        b3_,
        be3,
        c3,
        k0,
        b0,
        CT,
        DOT,
    )
    dq31, z31, dka31, dkb31 = off_grads(
        load_m(MA, t0, eos, i_hv, 3, 1, HV, BT, False),
        load_m(MB, t0, eos, i_hv, 3, 1, HV, BT, False),
        load_m(MA, t0, eos, i_hv, 3, 1, HV, BT, True),
        load_m(MB, t0, eos, i_hv, 3, 1, HV, BT, True),
        q3_,
        k3_,
        b3_,
        be3,
        c3,
        k1,
        b1,
        CT,
        DOT,
    )
    dq32, z32, dka32, dkb32 = off_grads(
        load_m(MA, t0, eos, i_hv, 3, 2, HV, BT, False),
        load_m(MB, t0, eos, i_hv, 3, 2, HV, BT, False),
        load_m(MA, t0, eos, i_hv, 3, 2, HV, BT, True),
        load_m(MB, t0, eos, i_hv, 3, 2, HV, BT, True),
        q3_,
        k3_,
        b3_,
        be3,
        c3,
        k2,
        b2,
        CT,
        DOT,
    )
    zero = tl.zeros([16, BK], dtype=tl.float32)
    dq3 += stack4(zero, dq10, dq20 + dq21, dq30 + dq31 + dq32)
    z3 += stack4(zero, z10, z20 + z21, z30 + z31 + z32)
    dka3 += stack4(dka10 + dka20 + dka30, dka21 + dka31, dka32, zero)
    dkb3 += stack4(dkb10 + dkb20 + dkb30, dkb21 + dkb31, dkb32, zero)

    dq_i = dq3 * scale
    dk_i = dka3 * scale + dkb3
    p_out = (rows3.to(tl.int64) * HV + i_hv) * K + ok[None, None, :]
    m_out = m3 & m_k[None, None, :]
    tl.store(dq + p_out, tl.load(dq + p_out, mask=m_out, other=0.0) + dq_i, mask=m_out)
    tl.store(dk + p_out, tl.load(dk + p_out, mask=m_out, other=0.0) + dk_i + beta3 * z3, mask=m_out)
    db = tl.load(dg + p_out, mask=m_out, other=0.0) + q3 * dq_i - k3 * dk_i + k3 * beta3 * z3
    # dg = reverse cumulative sum of db over the chunk's 64 rows (4 sub-chunks of 16).
    db2 = tl.reshape(db, (BT, BK))  # scan along axis 0 of the 64 rows
    dg2 = rsum(db2, 0)[None, :] - rcumsum(db2, 0) + db2
    tl.store(dg + p_out, tl.reshape(dg2, (4, 16, BK)), mask=m_out)
    # dβ gets Σ_c k ⊙ Z of this channel slice; the slices are summed on the host.
    p_b = dbeta_intra + i_k.to(tl.int64) * R * HV + rows3.to(tl.int64) * HV + i_hv
    tl.store(p_b, rsum(k3 * z3, 2)[:, :, None], mask=m3)
