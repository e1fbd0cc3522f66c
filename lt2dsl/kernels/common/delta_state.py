"""Sequential-over-chunks kernels of the delta-rule family: forward state scan and its reverse.

One program per (V tile, sequence x value head) walks the chunks of its sequence in order, keeping
the state tile S `[K, BV]` in fp32 registers. Per chunk (mixers.md §4–§6, b = chunk-local cumulative
log decay, γ = e^b, GATE 0 none / 1 scalar per token / 2 per key channel):

    U' = T Diag(β) (V − (K ⊙ γ) S)                  T from `delta_wy` / `kda.chunk_intra`
    O  = (sQ ⊙ γ) S + P U'                           P = s (Q Kᵀ ⊙ Γ), lower with diagonal
    S ← Diag(γ_C) S + (K ⊙ e^{b_C − b})ᵀ U'

The forward fuses the output into the scan, so neither the per-chunk states nor U' touch memory
unless the backward needs them (STORE_H / STORE_VNEW). For GDN and DeltaNet P is formed here from
q and k (scalar decay: Γ_ri = e^{b_r − b_i}); for KDA it is read from `Aqk`.

The reverse kernel carries dS (gradient of the state after the chunk) from the last chunk back:

    dU' = Pᵀ dO + (K ⊙ e^{b_C − b}) dS,   Y = Tᵀ dU'                 (stored: dh = dS, Y)
    dS ← Diag(γ_C) dS + (sQ ⊙ γ)ᵀ dO − (K ⊙ γ)ᵀ Diag(β) Y

Every transposed operand is a loaded tile (Pᵀ is recomputed as K Qᵀ or loaded transposed), never a
transposed dot result: see the Hopper note in `delta_tl`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.delta_tl import helper, mm, seq_coords


@helper
def load_chunk_gate(
    gcum,
    t0,
    eos,
    i_hv,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    GATE: tl.constexpr,
):
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
    """(γ, e^{b_C − b}, γ_C) shaped to scale rows of K `[BT, BK]` and of S `[BK, BV]`."""
    if GATE == 1:
        gam = tl.exp(b)[:, None]
        to_end = tl.exp(b_last - b)[:, None]
        gam_c = tl.exp(b_last)[:, None]  # [1, 1]
    else:
        gam = tl.exp(b)
        to_end = tl.exp(b_last[None, :] - b)
        gam_c = tl.exp(b_last)[:, None]  # [BK, 1]
    return gam, to_end, gam_c


@helper
def intra_qk(
    q, k, b, scale, BT: tl.constexpr, TRANSPOSED: tl.constexpr, GATE: tl.constexpr, DOT: tl.constexpr
):
    """P = s (Q Kᵀ) ⊙ Γ with the causal mask `[BT, BT]` (scalar or no decay), or Pᵀ = s (K Qᵀ) ⊙ Γᵀ."""
    ot = tl.arange(0, BT)
    if TRANSPOSED:
        p = mm(k, tl.trans(q), DOT)
        keep = ot[:, None] <= ot[None, :]
    else:
        p = mm(q, tl.trans(k), DOT)
        keep = ot[:, None] >= ot[None, :]
    if GATE == 1:
        # Exponents of kept entries are ≤ 0; masked ones are zeroed before exp (no inf formed).
        if TRANSPOSED:
            p = p * tl.exp(tl.where(keep, b[None, :] - b[:, None], 0.0))
        else:
            p = p * tl.exp(tl.where(keep, b[:, None] - b[None, :], 0.0))
    return tl.where(keep, p * scale, 0.0)


@helper
def load_square(ptr, t0, eos, i_hv, HV: tl.constexpr, BT: tl.constexpr, TRANSPOSED: tl.constexpr):
    """The chunk's `[BT, BT]` fp32 matrix from a `[B*T, HV, BT]` buffer (or its transpose)."""
    ot = tl.arange(0, BT)
    rows = t0 + ot
    base = ptr + i_hv * BT
    if TRANSPOSED:
        p = base + rows.to(tl.int64)[None, :] * (HV * BT) + ot[:, None]
        x = tl.load(p, mask=(rows < eos)[None, :], other=0.0)
    else:
        p = base + rows.to(tl.int64)[:, None] * (HV * BT) + ot[None, :]
        x = tl.load(p, mask=(rows < eos)[:, None], other=0.0)
    return x


@triton.jit
def delta_state_fwd_kernel(
    q,
    k,
    v,
    gcum,
    beta,
    Ainv,
    Aqk,
    h0,
    o,
    h,
    vnew,
    ht,
    cu_seqlens,
    chunk_offsets,
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
    USE_H0: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    STORE_H: tl.constexpr,
    STORE_VNEW: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr,
    CT: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, eos, NT, boh = seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    ot, ok = tl.arange(0, BT), tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    m_k, m_v = ok < K, ov < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_state = (i_nh.to(tl.int64) * K + ok[:, None]) * V + ov[None, :]

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + p_state, mask=m_kv, other=0.0).to(tl.float32)
    for i_t in range(NT):
        t0 = bos + i_t * BT
        rows = (t0 + ot).to(tl.int64)
        m_t = (t0 + ot) < eos
        if STORE_H:
            p_h = ((boh + i_t).to(tl.int64) * HV + i_hv) * K * V
            tl.store(h + p_h + ok[:, None] * V + ov[None, :], S.to(h.dtype.element_ty), mask=m_kv)
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_k = tl.load(k + (rows[:, None] * H + i_h) * K + ok[None, :], mask=m_tk, other=0.0)
        b_q = tl.load(q + (rows[:, None] * H + i_h) * K + ok[None, :], mask=m_tk, other=0.0)
        b_v = tl.load(v + (rows[:, None] * HV + i_hv) * V + ov[None, :], mask=m_tv, other=0.0)
        b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
        b_kf = b_k.to(tl.float32)
        b_qf = b_q.to(tl.float32) * scale
        if GATE != 0:
            b_g, b_glast = load_chunk_gate(gcum, t0, eos, i_hv, HV, K, BT, BK, GATE)
            gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
            b_kg = b_kf * gam
            b_qg = b_qf * gam
            b_kd = b_kf * to_end
        else:
            b_g = tl.zeros([BT], dtype=tl.float32)
            b_kg = b_kf
            b_qg = b_qf
            b_kd = b_kf
        S_c = S.to(CT)
        # U' = T Diag(β) (V − (K ⊙ γ) S): the true innovations of the chunk's tokens.
        x = b_v.to(tl.float32) - mm(b_kg.to(CT), S_c, DOT)
        b_T = load_square(Ainv, t0, eos, i_hv, HV, BT, False)
        u = mm(b_T.to(CT), (x * b_beta[:, None]).to(CT), DOT)
        u_c = u.to(CT)
        if STORE_VNEW:
            tl.store(vnew + (rows[:, None] * HV + i_hv) * V + ov[None, :], u_c, mask=m_tv)
        if GATE == 2:
            b_P = load_square(Aqk, t0, eos, i_hv, HV, BT, False)
        else:
            b_P = intra_qk(b_q, b_k, b_g, scale, BT, False, GATE, DOT)
        b_o = mm(b_qg.to(CT), S_c, DOT) + mm(b_P.to(CT), u_c, DOT)
        tl.store(o + (rows[:, None] * HV + i_hv) * V + ov[None, :], b_o.to(o.dtype.element_ty), mask=m_tv)
        if GATE != 0:
            S = S * gam_c
        S += mm(tl.trans(b_kd.to(CT)), u_c, DOT)
    if STORE_FINAL:
        tl.store(ht + p_state, S, mask=m_kv)


@triton.jit
def delta_state_bwd_kernel(
    q,
    k,
    gcum,
    beta,
    Ainv,
    Aqk,
    do,
    dht,
    dh,
    Y,
    dh0,
    cu_seqlens,
    chunk_offsets,
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
    USE_DHT: tl.constexpr,
    STORE_DH0: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr,
    CT: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, eos, NT, boh = seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    ot, ok = tl.arange(0, BT), tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    m_k, m_v = ok < K, ov < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_state = (i_nh.to(tl.int64) * K + ok[:, None]) * V + ov[None, :]

    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dS += tl.load(dht + p_state, mask=m_kv, other=0.0).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        t0 = bos + i_t * BT
        rows = (t0 + ot).to(tl.int64)
        m_t = (t0 + ot) < eos
        p_h = ((boh + i_t).to(tl.int64) * HV + i_hv) * K * V
        tl.store(dh + p_h + ok[:, None] * V + ov[None, :], dS.to(dh.dtype.element_ty), mask=m_kv)
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_k = tl.load(k + (rows[:, None] * H + i_h) * K + ok[None, :], mask=m_tk, other=0.0)
        b_q = tl.load(q + (rows[:, None] * H + i_h) * K + ok[None, :], mask=m_tk, other=0.0)
        b_do = tl.load(do + (rows[:, None] * HV + i_hv) * V + ov[None, :], mask=m_tv, other=0.0)
        b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
        b_kf = b_k.to(tl.float32)
        b_qf = b_q.to(tl.float32) * scale
        if GATE != 0:
            b_g, b_glast = load_chunk_gate(gcum, t0, eos, i_hv, HV, K, BT, BK, GATE)
            gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
            b_kg = b_kf * gam
            b_qg = b_qf * gam
            b_kd = b_kf * to_end
        else:
            b_g = tl.zeros([BT], dtype=tl.float32)
            b_kg = b_kf
            b_qg = b_qf
            b_kd = b_kf
        do_c = b_do.to(CT)
        if GATE == 2:
            b_Pt = load_square(Aqk, t0, eos, i_hv, HV, BT, True)
        else:
            b_Pt = intra_qk(b_q, b_k, b_g, scale, BT, True, GATE, DOT)
        du = mm(b_Pt.to(CT), do_c, DOT) + mm(b_kd.to(CT), dS.to(CT), DOT)
        b_Tt = load_square(Ainv, t0, eos, i_hv, HV, BT, True)
        b_y = mm(b_Tt.to(CT), du.to(CT), DOT)
        tl.store(Y + (rows[:, None] * HV + i_hv) * V + ov[None, :], b_y.to(Y.dtype.element_ty), mask=m_tv)
        if GATE != 0:
            dS = dS * gam_c
        dS += mm(tl.trans(b_qg.to(CT)), do_c, DOT)
        dS -= mm(tl.trans((b_kg * b_beta[:, None]).to(CT)), b_y.to(CT), DOT)
    if STORE_DH0:
        tl.store(dh0 + p_state, dS, mask=m_kv)
