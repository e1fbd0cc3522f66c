"""Per-chunk input gradients of DeltaNet / GDN (scalar or no decay), one program per chunk and head.

Given the chunk's start state S = h, the gradient dS' = dh of the state after it, U' (`vnew`) and
Y = Tᵀ dU' from the reverse scan (`delta_state`), with b the cumulative log decay, γ = e^b,
Γ_ri = e^{b_r − b_i}, P = s Q Kᵀ ⊙ Γ (r ≥ i), A = Diag(β) K Kᵀ ⊙ Γ (r > i):

    dv = β ⊙ Y                              dP = dO U'ᵀ,  dA = −Y U'ᵀ (strictly lower)
    dq = s γ ⊙ (dO Sᵀ) + s (dP ⊙ Γ) K
    dk = (e^{b_C − b} ⊙ U') dS'ᵀ − (γβ ⊙ Y) Sᵀ + s (dP ⊙ Γ)ᵀ Q + (β dA ⊙ Γ) K + (β dA ⊙ Γ)ᵀ K
    dβ = Σ_V Y ⊙ (V − γ K S) + rowsum(dA ⊙ K Kᵀ ⊙ Γ)
    db = s γ (dO · Sᵀq) + rows − cols of (dP ⊙ P) and (dA ⊙ A) − β (Y · γ Sᵀk) − e^{b_C − b} (U' · dS'ᵀk)
         + [last row] (Σ_r e^{b_C − b_r} U'_r · dS'ᵀk_r + γ_C ⟨S, dS'⟩)
    dg = reverse cumulative sum of db inside the chunk (b_r = Σ_{i≤r} g_i).

Row products such as dO · (Sᵀq) are formed as Σ_V dO ⊙ (Q S) tile by tile over V. The transposed
matrices (dP)ᵀ, (dA)ᵀ are accumulated as U' dOᵀ and U' Yᵀ from loaded tiles rather than by
transposing a dot result (Hopper miscompile, see `delta_tl`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.delta_state import gate_factors, load_chunk_gate
from lt2dsl.kernels.common.delta_tl import chunk_coords, mm, rcumsum, rsum


@triton.jit
def delta_grad_kernel(
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
    GATE: tl.constexpr,
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
    b_kf = b_k.to(tl.float32)
    if GATE == 1:
        b_g, b_glast = load_chunk_gate(gcum, t0, eos, i_hv, HV, K, BT, BK, GATE)
        gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
    else:
        b_g = tl.zeros([BT], dtype=tl.float32)
        gam = tl.full([BT, 1], 1.0, dtype=tl.float32)
        to_end = gam
        gam_c = tl.full([1, 1], 1.0, dtype=tl.float32)
    q_c, k_c = b_q.to(CT), b_k.to(CT)
    kg_c = (b_kf * gam).to(CT)
    kd_c = (b_kf * to_end).to(CT)

    acc_dq = tl.zeros([BT, BK], dtype=tl.float32)
    acc_dk = tl.zeros([BT, BK], dtype=tl.float32)
    dP = tl.zeros([BT, BT], dtype=tl.float32)
    dPt = tl.zeros([BT, BT], dtype=tl.float32)
    dA = tl.zeros([BT, BT], dtype=tl.float32)
    dAt = tl.zeros([BT, BT], dtype=tl.float32)
    r_qs = tl.zeros([BT], dtype=tl.float32)
    r_ykgs = tl.zeros([BT], dtype=tl.float32)
    r_yv = tl.zeros([BT], dtype=tl.float32)
    r_uds = tl.zeros([BT], dtype=tl.float32)
    s_sds = tl.zeros([1], dtype=tl.float32)
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
        b_y = tl.load(Y + p_tv, mask=m_tv, other=0.0)
        b_v = tl.load(v + p_tv, mask=m_tv, other=0.0).to(tl.float32)
        b_yf = b_y.to(tl.float32)
        y_c = b_y.to(CT)
        tl.store(dv + p_tv, (b_yf * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_tv)

        dP += mm(b_do, tl.trans(b_u), DOT)
        dPt += mm(b_u, tl.trans(b_do), DOT)
        dA += mm(y_c, tl.trans(b_u), DOT)
        dAt += mm(b_u, tl.trans(y_c), DOT)
        acc_dq += mm(b_do, tl.trans(b_S), DOT)
        acc_dk += mm((b_u.to(tl.float32) * to_end).to(CT), tl.trans(b_dS), DOT)
        acc_dk -= mm((b_yf * (b_beta[:, None] * gam)).to(CT), tl.trans(b_S), DOT)
        r_qs += rsum(b_do.to(tl.float32) * mm(q_c, b_S, DOT), 1)
        r_ykgs += rsum(b_yf * mm(kg_c, b_S, DOT), 1)
        r_yv += rsum(b_yf * b_v, 1)
        if GATE == 1:
            r_uds += rsum(b_u.to(tl.float32) * mm(kd_c, b_dS, DOT), 1)
            s_sds += rsum(rsum(b_S.to(tl.float32) * b_dS.to(tl.float32), 1), 0)

    lower = ot[:, None] >= ot[None, :]
    strict = ot[:, None] > ot[None, :]
    if GATE == 1:
        Gam = tl.exp(tl.where(lower, b_g[:, None] - b_g[None, :], 0.0))
        Gam_t = tl.exp(tl.where(ot[:, None] <= ot[None, :], b_g[None, :] - b_g[:, None], 0.0))
    else:
        Gam = tl.full([BT, BT], 1.0, dtype=tl.float32)
        Gam_t = Gam
    # dk from Pᵀ and Aᵀ uses the transposed accumulators: entry [i, r] pairs key i with row r.
    dPm = tl.where(lower, dP * Gam * scale, 0.0)
    dPtm = tl.where(ot[:, None] <= ot[None, :], dPt * Gam_t * scale, 0.0)
    dAm = tl.where(strict, -dA * Gam * b_beta[:, None], 0.0)
    dAtm = tl.where(ot[:, None] < ot[None, :], -dAt * Gam_t * b_beta[None, :], 0.0)
    b_dq = acc_dq * (gam * scale) + mm(dPm.to(CT), k_c, DOT)
    b_dk = acc_dk + mm(dPtm.to(CT), q_c, DOT) + mm(dAm.to(CT), k_c, DOT) + mm(dAtm.to(CT), k_c, DOT)
    p_tk = (rows[:, None] * HV + i_hv) * K + ok[None, :]
    tl.store(dq + p_tk, b_dq, mask=m_tk)
    tl.store(dk + p_tk, b_dk, mask=m_tk)

    Kk = tl.where(strict, mm(b_k, tl.trans(b_k), DOT) * Gam, 0.0)
    b_dbeta = r_yv - r_ykgs - rsum(dA * Kk, 1)
    tl.store(dbeta + rows * HV + i_hv, b_dbeta, mask=m_t)
    if GATE == 1:
        P = tl.where(lower, mm(b_q, tl.trans(b_k), DOT) * Gam * scale, 0.0)
        dPP = dP * P
        dAA = -dA * Kk * b_beta[:, None]
        db = r_qs * tl.exp(b_g) * scale + rsum(dPP, 1) - rsum(dPP, 0) + rsum(dAA, 1) - rsum(dAA, 0)
        db = db - b_beta * r_ykgs - r_uds
        last = tl.minimum(BT, eos - t0) - 1
        db += tl.where(ot == last, rsum(r_uds, 0) + tl.sum(gam_c, 1) * s_sds, 0.0)
        b_dg = rsum(db, 0) - rcumsum(db, 0) + db
        tl.store(dg + rows * HV + i_hv, b_dg, mask=m_t)
