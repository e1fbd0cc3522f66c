"""Per-chunk input gradients of the delta-rule family, after the reverse state scan.

Given each chunk's start state S = h, the gradient dS' = dh of the state after it, U' (`vnew`) and
Y = Tᵀ dU' (`scan_bwd`), with b the cumulative log decay, γ = e^b, Γ_ri = e^{b_r − b_i},
P = s Q Kᵀ ⊙ Γ (r ≥ i) and A = Diag(β) K Kᵀ ⊙ Γ (r > i) for a scalar or no decay:

    dv = β ⊙ Y                              dP = dO U'ᵀ,  dA = −Y U'ᵀ (strictly lower)
    dq = s γ ⊙ (dO Sᵀ) + (s dP ⊙ Γ) K
    dk = e^{b_C − b} ⊙ (U' dS'ᵀ) − βγ ⊙ (Y Sᵀ) + (s dP ⊙ Γ)ᵀ Q + (β dA ⊙ Γ) K + (β dA ⊙ Γ)ᵀ K
    dβ = Σ_V Y ⊙ V − γ k · (Y Sᵀ) + rowsum(dA ⊙ K Kᵀ ⊙ Γ)
    db = s γ q · (dO Sᵀ) + rows − cols of (dP ⊙ P) and (dA ⊙ A) − βγ k · (Y Sᵀ) − e^{b_C − b} k · (U' dS'ᵀ)
         + [last row] (Σ_r e^{b_C − b_r} k_r · (U' dS'ᵀ)_r + γ_C ⟨S, dS'⟩),   dg = reverse cumsum of db.

Three kernels keep the register footprint at a few 64 x 64 fp32 tiles each:

* `delta_grad_cc_kernel` (chunk, head): the V-reductions dP, dA, Σ_V Y ⊙ V and dv; for a scalar or
  no decay also P, A from q, k and their db / dβ terms. It stores s dP ⊙ Γ and β dA ⊙ Γ (KDA: the
  plain dP, dA, gated later per channel by `kda_grad`) to fp32 scratch `[B*T, HV, 64]`.
* `delta_grad_k_kernel` (K tile, chunk, head): dO Sᵀ, U' dS'ᵀ and Y Sᵀ over V. Gate factors scale
  rows (or, for KDA, elements) of these products, so they are applied after the V loop, where
  (scalar or no gate) the three fold into dq and dk. Then the scratch matrices, loaded as stored
  and transposed (no dot result is ever transposed: Hopper miscompile, see `helpers`), give the
  intra-chunk dq, dk, added in the MMA's accumulator. Per-row sums over the K tile go to a small
  partial buffer.
* `delta_grad_final_kernel` (chunk, head; scalar or no decay): adds the partials up into dβ and db,
  and dg = reverse cumsum of db inside the chunk.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.delta.helpers import chunk_head, mm, mm_xr, mm_xr_acc, mm_xx, rcumsum, rsum
from lt2dsl.kernels.delta.tiles import gate_factors, load_chunk_gate, load_tile, store_tile


@triton.jit
def delta_grad_cc_kernel(
    q, k, v, gcum, beta, vnew, Y, do, dv, MA, MB, dbeta_p, db_p, cu_seqlens, chunk_indices, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_hv, i_h, i_t, bos, eos, _ = chunk_head(i_c, i_bh, cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    DT = q.dtype.element_ty
    L, r0, b64 = eos - bos, i_t * BT, bos.to(tl.int64)
    v_base = (b64 * HV + i_hv) * V
    ot = tl.arange(0, BT)
    rows = b64 + r0 + ot
    m_t = r0 + ot < L
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)

    dP = tl.zeros([BT, BT], dtype=tl.float32)
    dA = tl.zeros([BT, BT], dtype=tl.float32)
    r_yv = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do = load_tile(do + v_base, r0, L, HV * V, i_v * BV, V, BT, BV)
        b_u = load_tile(vnew + v_base, r0, L, HV * V, i_v * BV, V, BT, BV)
        b_y = load_tile(Y + v_base, r0, L, HV * V, i_v * BV, V, BT, BV)
        b_v = load_tile(v + v_base, r0, L, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
        store_tile(dv + v_base, b_y * b_beta[:, None], r0, L, HV * V, i_v * BV, V, BT, BV)
        dP += mm(b_do, tl.trans(b_u), DOT)
        if GATE == 2:  # KDA keeps the form its GPU tests and timings ran with (TF32 on fp32 U')
            dA += mm_xx(b_y, tl.trans(b_u.to(tl.float32)), DT, PREC, DOT)
        else:  # U' stays a raw 16-bit operand, an fp32 Y enters as hi + lo halves (finer than TF32)
            dA += mm_xr(b_y, tl.trans(b_u), DT, PREC, DOT)
        r_yv += rsum(b_y * b_v, 1)

    lower = ot[:, None] >= ot[None, :]
    strict = ot[:, None] > ot[None, :]
    p_m = (rows[:, None] * HV + i_hv) * BT + ot[None, :]
    if GATE == 2:
        # KDA: the gating is per channel, applied to these in `kda_grad`.
        tl.store(MA + p_m, tl.where(lower, dP, 0.0), mask=m_t[:, None])
        tl.store(MB + p_m, tl.where(strict, -dA, 0.0), mask=m_t[:, None])
        tl.store(dbeta_p + rows * HV + i_hv, r_yv, mask=m_t)
    else:
        qk_base = (b64 * H + i_h) * K
        b_q = load_tile(q + qk_base, r0, L, H * K, 0, K, BT, BK)
        b_k = load_tile(k + qk_base, r0, L, H * K, 0, K, BT, BK)
        if GATE == 1:
            b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BK, GATE)
            Gam = tl.exp(tl.where(lower, b_g[:, None] - b_g[None, :], 0.0))
        else:
            Gam = tl.full([BT, BT], 1.0, dtype=tl.float32)
        Kk = tl.where(strict, mm(b_k, tl.trans(b_k), DOT) * Gam, 0.0)
        tl.store(MA + p_m, tl.where(lower, dP * Gam * scale, 0.0), mask=m_t[:, None])
        tl.store(MB + p_m, tl.where(strict, -dA * Gam * b_beta[:, None], 0.0), mask=m_t[:, None])
        tl.store(dbeta_p + rows * HV + i_hv, r_yv - rsum(dA * Kk, 1), mask=m_t)
        if GATE == 1:
            dPP = dP * tl.where(lower, mm(b_q, tl.trans(b_k), DOT) * Gam * scale, 0.0)
            dAA = -dA * Kk * b_beta[:, None]
            db = rsum(dPP, 1) - rsum(dPP, 0) + rsum(dAA, 1) - rsum(dAA, 0)
            tl.store(db_p + rows * HV + i_hv, db, mask=m_t)


@triton.jit
def delta_grad_k_kernel(
    q, k, gcum, beta, h, dh, vnew, Y, do, MA, MB, dq, dk, dg, part, part_sds, cu_seqlens, chunk_indices, T, R,
    NC, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_k, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hv, i_h, i_t, bos, eos, i_g = chunk_head(i_c, i_bh, cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    DT = q.dtype.element_ty
    L, r0, b64 = eos - bos, i_t * BT, bos.to(tl.int64)
    v_base = (b64 * HV + i_hv) * V
    p_h = (i_g.to(tl.int64) * HV + i_hv) * K * V
    ot = tl.arange(0, BT)
    rows = b64 + r0 + ot
    m_t = r0 + ot < L

    acc_q = tl.zeros([BT, BK], dtype=tl.float32)  # dO Sᵀ
    acc_u = tl.zeros([BT, BK], dtype=tl.float32)  # U' dS'ᵀ
    acc_y = tl.zeros([BT, BK], dtype=tl.float32)  # Y Sᵀ
    sds = tl.zeros([BK], dtype=tl.float32)  # Σ_V S ⊙ dS' per channel
    for i_v in range(tl.cdiv(V, BV)):
        b_S = load_tile(h + p_h, i_k * BK, K, V, i_v * BV, V, BK, BV)
        b_dS = load_tile(dh + p_h, i_k * BK, K, V, i_v * BV, V, BK, BV)
        b_do = load_tile(do + v_base, r0, L, HV * V, i_v * BV, V, BT, BV)
        b_u = load_tile(vnew + v_base, r0, L, HV * V, i_v * BV, V, BT, BV)
        b_y = load_tile(Y + v_base, r0, L, HV * V, i_v * BV, V, BT, BV)
        acc_q += mm(b_do, tl.trans(b_S), DOT)
        acc_u += mm(b_u, tl.trans(b_dS), DOT)
        acc_y += mm_xr(b_y, tl.trans(b_S), DT, PREC, DOT)
        sds += rsum(b_S.to(tl.float32) * b_dS.to(tl.float32), 1)

    qk_base = (b64 * H + i_h) * K
    b_q = load_tile(q + qk_base, r0, L, H * K, i_k * BK, K, BT, BK)
    b_k = load_tile(k + qk_base, r0, L, H * K, i_k * BK, K, BT, BK)
    qf, kf = b_q.to(tl.float32), b_k.to(tl.float32)
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    p_out = (rows[:, None] * HV + i_hv) * K + i_k * BK + tl.arange(0, BK)[None, :]
    m_out = m_t[:, None] & (i_k * BK + tl.arange(0, BK) < K)[None, :]
    p_part = (i_k.to(tl.int64) * R + rows) * HV + i_hv
    if GATE == 2:
        # KDA: per-channel factors on the elements of the V-reductions.
        ok = i_k * BK + tl.arange(0, BK)
        last = tl.minimum(bos + r0 + BT, eos) - 1
        b_glast = tl.load(gcum + (last.to(tl.int64) * HV + i_hv) * K + ok, mask=ok < K, other=0.0)
        b_g = tl.load(gcum + (rows[:, None] * HV + i_hv) * K + ok[None, :], mask=m_out, other=0.0)
        b_g = tl.where(m_t[:, None], b_g, b_glast[None, :])
        gam = tl.exp(b_g)
        b_dq = acc_q * gam * scale
        dk_s = acc_u * tl.exp(b_glast[None, :] - b_g)
        dk_x = -acc_y * gam * b_beta[:, None]
        db = qf * b_dq + kf * (dk_x - dk_s)
        db += tl.where(
            (ot == last - bos - r0)[:, None], (rsum(kf * dk_s, 0) + tl.exp(b_glast) * sds)[None, :], 0.0
        )
        tl.store(dq + p_out, b_dq, mask=m_out)
        tl.store(dk + p_out, dk_s + dk_x, mask=m_out)
        tl.store(dg + p_out, db, mask=m_out)
        tl.store(part + p_part * 3, -rsum(kf * gam * acc_y, 1), mask=m_t)
    else:
        if GATE == 1:
            b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BK, GATE)
            gam, to_end, _ = gate_factors(b_g, b_glast, GATE)
            tl.store(part + p_part * 3, rsum(qf * acc_q, 1), mask=m_t)
            tl.store(part + p_part * 3 + 2, rsum(kf * acc_u, 1), mask=m_t)
            b_dq = acc_q * (gam * scale)[:, None]
            b_dk = acc_u * to_end[:, None] - acc_y * (b_beta * gam)[:, None]
        else:
            b_dq = acc_q * scale
            b_dk = acc_u - acc_y * b_beta[:, None]
        tl.store(part + p_part * 3 + 1, rsum(kf * acc_y, 1), mask=m_t)
        tl.store(part_sds + (i_k.to(tl.int64) * NC + i_g) * HV + i_hv, rsum(sds, 0))
        # The three accumulators are folded into two before the intra-chunk products, which add
        # into them (tl.dot's accumulator), so no more than two [BT, BK] fp32 tiles stay live
        # past the V loop; the symmetric (β dA ⊙ Γ) + (β dA ⊙ Γ)ᵀ enters one product, not two.
        b_MA = load_tile(MA + (b64 * HV + i_hv) * BT, r0, L, HV * BT, 0, BT, BT, BT)
        b_dq = mm_xr_acc(b_MA, b_k, b_dq, DT, PREC, DOT)
        tl.store(dq + p_out, b_dq.to(dq.dtype.element_ty), mask=m_out)
        b_dk = mm_xr_acc(tl.trans(b_MA), b_q, b_dk, DT, PREC, DOT)
        m_base = MB + (b64 * HV + i_hv) * BT
        # strictly lower plus its transpose: disjoint supports, so the sum is exact in 16 bits too
        b_MS = load_tile(m_base, r0, L, HV * BT, 0, BT, BT, BT)
        b_MS += load_tile(m_base, r0, L, HV * BT, 0, BT, BT, BT, TRANSPOSED=True)
        b_dk = mm_xr_acc(b_MS, b_k, b_dk, DT, PREC, DOT)
        tl.store(dk + p_out, b_dk.to(dk.dtype.element_ty), mask=m_out)


@triton.jit
def delta_grad_final_kernel(
    gcum, beta, dbeta_p, db_p, part, part_sds, dbeta, dg, cu_seqlens, chunk_indices, T, R, NC, scale,
    HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, NK: tl.constexpr, GATE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_hv, _, i_t, bos, eos, i_g = chunk_head(i_c, i_bh, cu_seqlens, chunk_indices, T, HV, HV, BT, IS_VARLEN)
    L, r0 = eos - bos, i_t * BT
    ot = tl.arange(0, BT)
    rows = bos.to(tl.int64) + r0 + ot
    m_t = r0 + ot < L
    r_qs = tl.zeros([BT], dtype=tl.float32)
    r_ykgs = tl.zeros([BT], dtype=tl.float32)
    r_uds = tl.zeros([BT], dtype=tl.float32)
    sds = tl.zeros([1], dtype=tl.float32)
    for i_k in tl.static_range(NK):
        p_part = ((i_k * R + rows) * HV + i_hv) * 3
        r_ykgs += tl.load(part + p_part + 1, mask=m_t, other=0.0)
        if GATE == 1:  # the q and U' sums are written for the gate's db only
            r_qs += tl.load(part + p_part, mask=m_t, other=0.0)
            r_uds += tl.load(part + p_part + 2, mask=m_t, other=0.0)
        sds += tl.load(part_sds + (i_k * NC + i_g) * HV + i_hv + tl.zeros([1], dtype=tl.int32))
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    if GATE == 1:
        b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BT, GATE)
        gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
    else:
        gam = tl.full([BT], 1.0, dtype=tl.float32)
    b_dbeta = tl.load(dbeta_p + rows * HV + i_hv, mask=m_t, other=0.0) - gam * r_ykgs
    tl.store(dbeta + rows * HV + i_hv, b_dbeta, mask=m_t)
    if GATE == 1:
        db = tl.load(db_p + rows * HV + i_hv, mask=m_t, other=0.0)
        db += scale * gam * r_qs - b_beta * gam * r_ykgs - to_end * r_uds
        last = tl.minimum(BT, L - r0) - 1
        db += tl.where(ot == last, rsum(to_end * r_uds, 0) + rsum(gam_c, 1) * sds, 0.0)
        tl.store(dg + rows * HV + i_hv, rsum(db, 0) - rcumsum(db, 0) + db, mask=m_t)
