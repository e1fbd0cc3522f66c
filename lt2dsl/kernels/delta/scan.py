"""The forward state scans of the delta-rule family and the split form's output kernel.

Only the recurrence is sequential (mixers.md §4–§6; b = chunk-local cumulative log decay, γ = e^b,
T = (I + A)^{-1}, GATE 0 none / 1 scalar per token / 2 per key channel):

    U' = T Diag(β)(V − (K ⊙ γ) S_c);   S ← Diag(γ_C) S + (K ⊙ e^{b_C − b})ᵀ U'
    O = (sQ ⊙ γ) S_c + P U',   P = s (Q Kᵀ ⊙ Γ) lower with diagonal

`DeltaRecipe.fused_scan` picks the form. Fused (GATE 0 or 1): `delta_hot_fwd_kernel` forms O in
the scan from the S_c and U' still in registers. Split (every gate; DeltaNet as GATE 1 with b = 0):
`delta_h_fwd_kernel` stores S_c and U' (fp32) and `delta_o_fwd_kernel` forms O per chunk, P from Q
and K for a scalar gate, read from `Aqk` for KDA's per-channel one. Either way the S_c and U'
stored for the backward are the same.

Precision with 16-bit inputs: S_c and U' are stored in the input dtype for the backward; K·S and
Q·S take S and the keys in the input dtype; the dots into the state and the output (Kᵀ·U', P·U')
and T·X take fp32-grade operands with PREC (`helpers.mm_xx`: TF32; `mm_xr`: hi + lo halves).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.tl_util import cast, helper
from lt2dsl.kernels.delta.helpers import causal_scores, chunk_tile_program, mm, mm_xr, mm_xx, seq_program
from lt2dsl.kernels.delta.tiles import (
    gate_factors,
    load_chunk_gate,
    load_square,
    load_tile,
    store_tile,
)


@triton.jit
def delta_h_fwd_kernel(
    k, v, gcum, beta, Ainv, h0, h, un32, vnew, ht, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GATE: tl.constexpr, USE_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
    STORE_VNEW: tl.constexpr, IS_VARLEN: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_v, i_nh, i_hv, i_h, bos, eos, NT, boh, L, _, k_base, v_base, s_base = seq_program(
        cu_seqlens, chunk_offsets, T, H, HV, K, V, BT, IS_VARLEN
    )
    DT = k.dtype.element_ty

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += load_tile(h0 + s_base, 0, K, V, i_v * BV, V, BK, BV).to(tl.float32)
    for i_t in range(NT):
        r0 = i_t * BT
        p_h = h + ((boh + i_t).to(tl.int64) * HV + i_hv) * K * V
        store_tile(p_h, S, 0, K, V, i_v * BV, V, BK, BV)
        b_k = load_tile(k + k_base, r0, L, H * K, 0, K, BT, BK)
        b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BK, GATE)
        gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
        if GATE == 1:
            gam, to_end = gam[:, None], to_end[:, None]
        b_v = load_tile(v + v_base, r0, L, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
        b_beta = tl.load(
            beta + (bos + r0 + tl.arange(0, BT)).to(tl.int64) * HV + i_hv,
            mask=r0 + tl.arange(0, BT) < L,
            other=0.0,
        ).to(tl.float32)
        ks = mm(cast(b_k.to(tl.float32) * gam, DT), cast(S, DT), DOT)
        # U' = T Diag(β) (V − (K ⊙ γ) S); padded rows of T are 0, so their U' is 0.
        b_T = load_square(Ainv, bos + r0, eos, i_hv, HV, BT, False)
        un = mm_xx(b_T, (b_v - ks) * b_beta[:, None], DT, PREC, DOT)
        store_tile(un32 + v_base, un, r0, L, HV * V, i_v * BV, V, BT, BV)
        if STORE_VNEW:
            store_tile(vnew + v_base, un, r0, L, HV * V, i_v * BV, V, BT, BV)
        S = S * gam_c + mm_xx(tl.trans(b_k.to(tl.float32) * to_end), un, DT, PREC, DOT)
    if STORE_FINAL:
        store_tile(ht + s_base, S, 0, K, V, i_v * BV, V, BK, BV)


@helper
def _gated_cols(x, gam, GATE: tl.constexpr):
    """x ⊙ γ over columns; without a gate (DeltaNet, GATE 0) γ = 1 and no factor is applied."""
    if GATE == 1:
        x = x * gam[None, :]
    return x


@helper
def _scaled_cols(x, gam, scale, GATE: tl.constexpr):
    """x ⊙ (s γ) over columns (x s without a gate)."""
    if GATE == 1:
        x = x * (gam * scale)[None, :]
    else:
        x = x * scale
    return x


@helper
def _scores_t(b_k, b_qt, b_g, m_t, scale, BT: tl.constexpr, GATE: tl.constexpr, DOT: tl.constexpr):
    """Pᵀ[i, r] = s k_i·q_r e^{b_r − b_i} for i ≤ r < n, else 0 (no exponentials without a gate).
    `causal_scores(..., TRANSPOSED=True)` is the same product from Q as loaded and transposes it in
    registers; the transposed scan reads Qᵀ through transposed pointers instead."""
    ot = tl.arange(0, BT)
    keep = (ot[None, :] >= ot[:, None]) & m_t[None, :]
    b_P = mm(b_k, b_qt, DOT) * scale
    if GATE == 1:
        b_P = b_P * tl.exp(tl.where(keep, b_g[None, :] - b_g[:, None], 0.0))
    return tl.where(keep, b_P, 0.0)


@helper
def _state_step_t(St, un, b_k, gam_c, to_end, DT: tl.constexpr, PREC: tl.constexpr, GATE: tl.constexpr,
                  DOT: tl.constexpr):  # fmt: skip
    """Sᵀ ← γ_C Sᵀ + (U'ᵀ ⊙ e^{b_C − b}) K, or Sᵀ + U'ᵀ K without a gate."""
    if GATE == 1:
        St = St * gam_c + mm_xr(un * to_end[None, :], b_k, DT, PREC, DOT)
    else:
        St = St + mm_xr(un, b_k, DT, PREC, DOT)
    return St


@triton.jit
def delta_hot_fwd_kernel(
    q, k, v, gcum, beta, Ainv, h0, h, vnew, o, ht, cu_seqlens, chunk_offsets, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GATE: tl.constexpr, USE_H0: tl.constexpr, STORE_FINAL: tl.constexpr, SAVE: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The state scan forming the output itself, with the state held transposed, Sᵀ `[BV, K]`
    (scalar gate, GATE 1, or none, GATE 0: DeltaNet's scan carries no gate code at all):

        U'ᵀ = (Vᵀ − (Sᵀ Kᵀ) ⊙ γ) Diag(β) Tᵀ,   Oᵀ = (Sᵀ sQᵀ) ⊙ γ + U'ᵀ Pᵀ,
        Sᵀ ← γ_C Sᵀ + (U'ᵀ ⊙ e^{b_C − b}) K.

    Every dot on the recurrence takes the computed tile as its left operand and a tile loaded from
    memory as its right one, because Hopper's wgmma reads its left operand from registers and its
    right one only from shared memory: written as S, the state and U' would go through shared
    memory on every chunk. Kᵀ, Qᵀ, Vᵀ and Tᵀ are read through transposed pointers, Pᵀ = s K Qᵀ ⊙ Γᵀ
    is formed directly, and the stores of O, U' and S_c write the transposed tiles to the usual
    layouts, so the buffers are those of the split form. The output's dots are off the
    recurrence's dependent path: Q·S reads the S that K·S reads, Pᵀ depends on inputs only. With
    SAVE the chunk states and U' are stored, in the input dtype, for the backward; inference
    writes neither."""
    tl.static_assert(GATE <= 1, "the fused scan takes no gate or a scalar one")
    i_v, i_nh, i_hv, i_h, bos, eos, NT, boh, L, _, k_base, v_base, s_base = seq_program(
        cu_seqlens, chunk_offsets, T, H, HV, K, V, BT, IS_VARLEN
    )
    DT = k.dtype.element_ty
    ot = tl.arange(0, BT)

    St = tl.zeros([BV, BK], dtype=tl.float32)
    if USE_H0:
        St += load_tile(h0 + s_base, 0, K, V, i_v * BV, V, BK, BV, TRANSPOSED=True).to(tl.float32)
    for i_t in range(NT):
        r0 = i_t * BT
        m_t = r0 + ot < L
        if SAVE:
            p_h = h + ((boh + i_t).to(tl.int64) * HV + i_hv) * K * V
            store_tile(p_h, St, 0, K, V, i_v * BV, V, BK, BV, TRANSPOSED=True)
        b_qt = load_tile(q + k_base, r0, L, H * K, 0, K, BT, BK, TRANSPOSED=True)
        b_k = load_tile(k + k_base, r0, L, H * K, 0, K, BT, BK)
        if GATE == 1:
            b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BK, GATE)
            gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
        else:  # DeltaNet: γ = 1, never formed (placeholders the helpers do not read)
            b_g = tl.zeros([BT], dtype=tl.float32)
            gam, to_end, gam_c = b_g, b_g, 1.0
        S16 = cast(St, DT)
        qs = _scaled_cols(mm(S16, b_qt, DOT), gam, scale, GATE)
        b_kt = load_tile(k + k_base, r0, L, H * K, 0, K, BT, BK, TRANSPOSED=True)
        b_v = load_tile(v + v_base, r0, L, HV * V, i_v * BV, V, BT, BV, TRANSPOSED=True).to(tl.float32)
        b_beta = tl.load(beta + (bos + r0 + ot).to(tl.int64) * HV + i_hv, mask=m_t, other=0.0)
        ks = _gated_cols(mm(S16, b_kt, DOT), gam, GATE)
        # padded columns of Tᵀ are 0, so their U' is 0 and adds nothing to the state
        b_Tt = load_tile(Ainv + (bos + r0).to(tl.int64) * HV * BT + i_hv * BT, 0, L - r0, HV * BT,
                           0, BT, BT, BT, TRANSPOSED=True)  # fmt: skip
        un = mm_xx((b_v - ks) * b_beta.to(tl.float32)[None, :], b_Tt, DT, PREC, DOT)
        if SAVE:
            store_tile(vnew + v_base, un, r0, L, HV * V, i_v * BV, V, BT, BV, TRANSPOSED=True)
        b_P = _scores_t(b_k, b_qt, b_g, m_t, scale, BT, GATE, DOT)
        b_o = qs + mm_xx(un, b_P, DT, PREC, DOT)
        store_tile(o + v_base, b_o, r0, L, HV * V, i_v * BV, V, BT, BV, TRANSPOSED=True)
        St = _state_step_t(St, un, b_k, gam_c, to_end, DT, PREC, GATE, DOT)
    if STORE_FINAL:
        store_tile(ht + s_base, St, 0, K, V, i_v * BV, V, BK, BV, TRANSPOSED=True)


@triton.jit
def delta_o_fwd_kernel(
    q, k, gcum, Aqk, h, un32, o, cu_seqlens, chunk_indices, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_v, i_hv, i_h, i_g, t0, eos, n, qk_base, v_base = chunk_tile_program(
        cu_seqlens, chunk_indices, T, H, HV, K, V, BT, IS_VARLEN
    )
    DT = q.dtype.element_ty

    b_q = load_tile(q + qk_base, 0, n, H * K, 0, K, BT, BK)
    b_g, b_glast = load_chunk_gate(gcum, t0, eos, i_hv, HV, K, BT, BK, GATE)
    gam, _, _ = gate_factors(b_g, b_glast, GATE)
    if GATE == 1:
        # P = s (Q Kᵀ ⊙ Γ) here: one more dot per chunk instead of a [BT, BT] fp32 round trip.
        b_k = load_tile(k + qk_base, 0, n, H * K, 0, K, BT, BK)
        b_P = causal_scores(b_q, b_k, b_g, n, scale, BT, True, False, DOT)
        gam = gam[:, None]
    else:
        b_P = load_square(Aqk, t0, eos, i_hv, HV, BT, False)
    b_S = load_tile(h + (i_g.to(tl.int64) * HV + i_hv) * K * V, 0, K, V, i_v * BV, V, BK, BV)
    b_o = mm(cast(b_q.to(tl.float32) * (gam * scale), DT), b_S, DOT)
    b_un = load_tile(un32 + v_base, 0, n, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
    b_o += mm_xx(b_P, b_un, DT, PREC, DOT)
    store_tile(o + v_base, b_o, 0, n, HV * V, i_v * BV, V, BT, BV)
