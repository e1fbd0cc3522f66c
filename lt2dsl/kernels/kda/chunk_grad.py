"""KDA input gradients per chunk, after the reverse state scan of `common/delta_state`.

With b the per-channel cumulative log decay, γ = e^b, and S, dS', U', Y as in `common/delta_grad`:

`kda_grad_state_kernel` (one program per chunk and head, all channels) handles everything that
touches the state or sums over V:

    dv = β ⊙ Y,   dAqk = dO U'ᵀ (r ≥ i),   dA = −Y U'ᵀ (r > i)          (scratch, fp32)
    dq  = s γ ⊙ (dO Sᵀ),   dk = e^{b_C − b} ⊙ (U' dS'ᵀ) − γ ⊙ (βY Sᵀ)
    db  = q ⊙ dq + k ⊙ [−γ ⊙ (βY Sᵀ)] − k ⊙ [e^{b_C − b} ⊙ (U' dS'ᵀ)]
          + [last row] Σ_r k_r ⊙ e^{b_C − b_r} ⊙ (dS' U'_r) + γ_C ⊙ Σ_V (S ⊙ dS')
    dβ  = Σ_V Y ⊙ (V − (K ⊙ γ) S)

`kda_grad_intra_kernel` (one program per K slice, chunk and head) adds the gated intra-chunk terms;
each channel is independent, so the kernel tiles K:

    dq_r += s Σ_{i≤r} dAqk_ri k_i e^{b_r − b_i}            Z_r = Σ_{i<r} dA_ri k_i e^{b_r − b_i}
    dk_i += s Σ_{r≥i} dAqk_ri q_r e^{b_r − b_i} + Σ_{r>i} β_r dA_ri k_r e^{b_r − b_i} + β_i Z_i
    db   += q ⊙ (intra dq) − k ⊙ (the two column sums above) + k ⊙ β Z,   dβ += Σ_c k ⊙ Z

then dg = reverse cumulative sum of db inside the chunk. The gated products use the same 16-token
sub-chunks and reference points as `chunk_intra`, so every exponent stays ≤ 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.delta_state import gate_factors, load_chunk_gate
from lt2dsl.kernels.common.delta_tl import chunk_coords, helper, mm, pick4, rcumsum, rsum, stack4
from lt2dsl.kernels.kda.chunk_intra import load3


@triton.jit
def kda_grad_state_kernel(
    q,
    k,
    v,
    gcum,
    beta,
    h,
    dh,
    vnew,
    Y,
    do,
    dq,
    dk,
    dv,
    dbeta,
    dg,
    MA,
    MB,
    cu_seqlens,
    chunk_indices,
    T,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr,
    CT: tl.constexpr,
):
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    _, i_t, bos, eos = chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    i_g = i_c if IS_VARLEN else i_b * tl.cdiv(T, BT) + i_c
    t0 = bos + i_t * BT
    ot, ok = tl.arange(0, BT), tl.arange(0, BK)
    rows = (t0 + ot).to(tl.int64)
    m_t = (t0 + ot) < eos
    m_tk = m_t[:, None] & (ok < K)[None, :]

    b_q = tl.load(q + (rows[:, None] * H + i_h) * K + ok[None, :], mask=m_tk, other=0.0)
    b_k = tl.load(k + (rows[:, None] * H + i_h) * K + ok[None, :], mask=m_tk, other=0.0)
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    b_g, b_glast = load_chunk_gate(gcum, t0, eos, i_hv, HV, K, BT, BK, 2)
    gam, to_end, gam_c = gate_factors(b_g, b_glast, 2)
    kg_c = (b_k.to(tl.float32) * gam).to(CT)

    acc_dq = tl.zeros([BT, BK], dtype=tl.float32)
    acc_dks = tl.zeros([BT, BK], dtype=tl.float32)
    acc_dkx = tl.zeros([BT, BK], dtype=tl.float32)
    dAqk = tl.zeros([BT, BT], dtype=tl.float32)
    dA = tl.zeros([BT, BT], dtype=tl.float32)
    r_yv = tl.zeros([BT], dtype=tl.float32)
    r_ykgs = tl.zeros([BT], dtype=tl.float32)
    s_sds = tl.zeros([BK], dtype=tl.float32)
    p_h = (i_g.to(tl.int64) * HV + i_hv) * K * V
    for i_v in range(tl.cdiv(V, BV)):
        ov = i_v * BV + tl.arange(0, BV)
        m_v = ov < V
        m_kv = (ok < K)[:, None] & m_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_S = tl.load(h + p_h + ok[:, None] * V + ov[None, :], mask=m_kv, other=0.0).to(CT)
        b_dS = tl.load(dh + p_h + ok[:, None] * V + ov[None, :], mask=m_kv, other=0.0).to(CT)
        p_tv = (rows[:, None] * HV + i_hv) * V + ov[None, :]
        b_do = tl.load(do + p_tv, mask=m_tv, other=0.0).to(CT)
        b_u = tl.load(vnew + p_tv, mask=m_tv, other=0.0).to(CT)
        b_yf = tl.load(Y + p_tv, mask=m_tv, other=0.0).to(tl.float32)
        b_v = tl.load(v + p_tv, mask=m_tv, other=0.0).to(tl.float32)
        tl.store(dv + p_tv, (b_yf * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_tv)
        y_c = b_yf.to(CT)
        dAqk += mm(b_do, tl.trans(b_u), DOT)
        dA += mm(y_c, tl.trans(b_u), DOT)
        acc_dq += mm(b_do, tl.trans(b_S), DOT)
        acc_dks += mm(b_u, tl.trans(b_dS), DOT)
        acc_dkx += mm((b_yf * b_beta[:, None]).to(CT), tl.trans(b_S), DOT)
        r_yv += rsum(b_yf * b_v, 1)
        r_ykgs += rsum(b_yf * mm(kg_c, b_S, DOT), 1)
        s_sds += rsum(b_S.to(tl.float32) * b_dS.to(tl.float32), 1)

    b_dq = acc_dq * gam * scale
    dk_s = acc_dks * to_end
    dk_x = -acc_dkx * gam
    b_kf = b_k.to(tl.float32)
    db = b_q.to(tl.float32) * b_dq + b_kf * (dk_x - dk_s)
    last = tl.minimum(BT, eos - t0) - 1
    db += tl.where((ot == last)[:, None], (rsum(b_kf * dk_s, 0) + tl.exp(b_glast) * s_sds)[None, :], 0.0)
    p_tk = (rows[:, None] * HV + i_hv) * K + ok[None, :]
    tl.store(dq + p_tk, b_dq, mask=m_tk)
    tl.store(dk + p_tk, dk_s + dk_x, mask=m_tk)
    tl.store(dg + p_tk, db, mask=m_tk)
    tl.store(dbeta + rows * HV + i_hv, r_yv - r_ykgs, mask=m_t)
    p_m = (rows[:, None] * HV + i_hv) * BT + ot[None, :]
    tl.store(MA + p_m, tl.where(ot[:, None] >= ot[None, :], dAqk, 0.0), mask=m_t[:, None])
    tl.store(MB + p_m, tl.where(ot[:, None] > ot[None, :], -dA, 0.0), mask=m_t[:, None])


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


@helper
def last_row16(x):
    """Row 15 of a `[16, N]` tile."""
    return rsum(tl.where(tl.arange(0, 16)[:, None] == 15, x, 0.0), 0)


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
    tot = rsum(db, 1)  # [4, BK]
    after = rsum(tot, 0)[None, :] - rcumsum(tot, 0)
    tl.store(dg + p_out, tot[:, None, :] - rcumsum(db, 1) + db + after[:, None, :], mask=m_out)
    # dβ gets Σ_c k ⊙ Z of this channel slice; the slices are summed on the host.
    p_b = dbeta_intra + i_k.to(tl.int64) * R * HV + rows3.to(tl.int64) * HV + i_hv
    tl.store(p_b, rsum(k3 * z3, 2)[:, :, None], mask=m3)
