"""Split chunked forms of the delta-rule family: the state scan apart from the output.

The fused scan (`delta_state_fwd_kernel`) does five dots per chunk inside its sequential loop and
reloads Q, K, T and P once per 16-wide value tile. Here only the recurrence stays sequential
(mixers.md §4–§6; b = chunk-local cumulative log decay, γ = e^b, T = (I + A)^{-1}):

    S_c stored;  U' = T Diag(β)(V − (K ⊙ γ) S_c);  S ← Diag(γ_C) S + (K ⊙ e^{b_C − b})ᵀ U'
                                                                     `delta_h_fwd_kernel` (default)
    O = (sQ ⊙ γ) S_c + P U',   P = s (Q Kᵀ ⊙ Γ) lower with diagonal   `delta_o_fwd_kernel`, per chunk

With WU (`LT2_DELTA_WU=1`), W = T Diag(β)(K ⊙ γ) and U = T Diag(β) V come first, per chunk
(`delta_wu_fwd_kernel`), and the scan's innovation is U' = U − W S_c: two dots on the sequential
path instead of three, as the peer's scan, but slower overall on the H200 (the W/U pass) and less
precise (W, U in the input dtype). Either way U' is the same innovation, so the chunk states S_c
and U' written here are what the backward reads. P is formed in the output kernel from Q and K
for the scalar gate (GDN, DeltaNet), and read from `Aqk` for KDA's per-channel gate.

For a scalar gate the default inference forward is one kernel, `delta_hot_fwd_kernel`: the scan with the
output formed in it and the state held transposed (Sᵀ, so the state and U' are the left operands
of their dots, read from registers on Hopper); `delta_ho_fwd_kernel` is the same untransposed.

The W-based backward (the default; `LT2_DELTA_WBWD=0` selects delta_state's fused reverse scan):
`delta_du0_kernel` (Pᵀ dO per chunk), `delta_dh_bwd_kernel` (reverse scan with Wᵀ),
`delta_y_kernel` (Y = Tᵀ dU' per chunk).

Precision with 16-bit inputs: S_c and U' are stored in the input dtype for the backward, U' also
in fp32 for the output (default); K·S and Q·S take S and the scaled keys in the input dtype; the
dots into the state and the output (Kᵀ·U', P·U') and T·X take fp32-grade operands with PREC (TF32).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.tl_util import cast, helper
from lt2dsl.kernels.delta.helpers import (
    causal_scores,
    chunk_coords,
    mm,
    mm_xb,
    mm_xr,
    mm_xx,
    seq_coords,
    split16,
)
from lt2dsl.kernels.delta.state import (
    gate_factors,
    load_chunk_gate,
    load_square,
    load_tile,
    load_tile_t,
    store_tile,
    store_tile_t,
)


@triton.jit
def delta_wu_fwd_kernel(
    k,
    v,
    gcum,
    beta,
    Ainv,
    w,
    u,
    cu_seqlens,
    chunk_indices,
    T,
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
    PREC: tl.constexpr,
    STORE_U: tl.constexpr = True,
):
    """W = T Diag(β) (K ⊙ γ) `[B*T, HV, K]` and (STORE_U) U = T Diag(β) V `[B*T, HV, V]` of one chunk,
    stored in the input dtype."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    _, i_t, bos, eos = chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    t0 = bos + i_t * BT
    n = eos - t0
    DT = k.dtype.element_ty
    t64 = t0.to(tl.int64)
    ot = tl.arange(0, BT)
    b_beta = tl.load(beta + (t0 + ot).to(tl.int64) * HV + i_hv, mask=ot < n, other=0.0).to(tl.float32)
    b_T = load_square(Ainv, t0, eos, i_hv, HV, BT, False)
    b_g, b_glast = load_chunk_gate(gcum, t0, eos, i_hv, HV, K, BT, BK, GATE)
    gam, _, _ = gate_factors(b_g, b_glast, GATE)
    if GATE == 1:
        # the row factors of K and V are T's column factors: T Diag(βγ) as hi + lo halves against
        # the raw 16-bit tiles (finer than TF32; no fp32 copies of K and V through shared memory)
        b_k = load_tile(k + (t64 * H + i_h) * K, 0, n, H * K, 0, K, BT, BK)
        b_w = mm_xr(b_T * (gam * b_beta)[None, :], b_k, DT, PREC, DOT)
    else:
        b_k = load_tile(k + (t64 * H + i_h) * K, 0, n, H * K, 0, K, BT, BK).to(tl.float32)
        b_w = mm_xx(b_T, b_k * gam * b_beta[:, None], DT, PREC, DOT)
    store_tile(w + (t64 * HV + i_hv) * K, b_w, 0, n, HV * K, 0, K, BT, BK)
    if STORE_U:
        v_base = (t64 * HV + i_hv) * V
        b_Tb = b_T * b_beta[None, :]
        for i_v in range(tl.cdiv(V, BV)):
            b_v = load_tile(v + v_base, 0, n, HV * V, i_v * BV, V, BT, BV)
            b_u = mm_xr(b_Tb, b_v, DT, PREC, DOT)
            store_tile(u + v_base, b_u, 0, n, HV * V, i_v * BV, V, BT, BV)


@triton.jit
def delta_h_fwd_kernel(
    k,
    v,
    gcum,
    beta,
    Ainv,
    w,
    u,
    h0,
    h,
    un32,
    vnew,
    ht,
    cu_seqlens,
    chunk_offsets,
    T,
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
    STORE_VNEW: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
    WU: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, eos, NT, boh = seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    DT = k.dtype.element_ty
    L = eos - bos
    b64 = bos.to(tl.int64)
    k_base = (b64 * H + i_h) * K
    w_base = (b64 * HV + i_hv) * K
    v_base = (b64 * HV + i_hv) * V
    s_base = i_nh.to(tl.int64) * K * V

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
        if WU:
            # U' = U − W S; padded rows of W and U are 0, so their U' is 0 and adds nothing.
            b_w = load_tile(w + w_base, r0, L, HV * K, 0, K, BT, BK)
            b_u = load_tile(u + v_base, r0, L, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
            un = b_u - mm(b_w, cast(S, DT), DOT)
        else:
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


@triton.jit
def delta_ho_fwd_kernel(
    q,
    k,
    v,
    gcum,
    beta,
    Ainv,
    w,
    u,
    h0,
    h,
    vnew,
    o,
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
    SAVE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
    WU: tl.constexpr,
):
    """The scalar-gate state scan with the output formed in it (`LT2_DELTA_FUSED_O`; GDN, and
    DeltaNet as b = 0): the scan of `delta_h_fwd_kernel` plus, per chunk,
    O = (sQ ⊙ γ) S_c + P U' from the S_c and U' still in registers, so neither goes through memory
    for the output (the split form writes S_c and an fp32 U' that `delta_o_fwd_kernel` reads
    back). With SAVE both are still stored, in the input dtype, for the backward. The extra dots
    are off the recurrence's dependent path: Q·S reads the S that K·S reads, P·U' runs beside
    Kᵀ·U', and P = s (Q Kᵀ ⊙ Γ) depends on inputs only.

    A scalar gate scales rows, so it is applied to dot results and to U' rather than to copies of
    Q and K: the raw 16-bit tiles go to the dots, and the state update and P take Kᵀ loaded
    transposed from memory (the keys are read twice, the second time from cache; no raw tile is
    transposed in registers: delta_state's note on Triton 3.6). KDA's per-channel gate keeps the
    split form: with its `[BT, K]` gate tiles this kernel spills 0.3-0.9 KB per thread offline."""
    tl.static_assert(GATE == 1, "the fused scan takes the scalar-gate code only")
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, eos, NT, boh = seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    DT = k.dtype.element_ty
    L = eos - bos
    b64 = bos.to(tl.int64)
    k_base = (b64 * H + i_h) * K
    w_base = (b64 * HV + i_hv) * K
    v_base = (b64 * HV + i_hv) * V
    s_base = i_nh.to(tl.int64) * K * V
    ot = tl.arange(0, BT)
    ok = tl.arange(0, BK)

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += load_tile(h0 + s_base, 0, K, V, i_v * BV, V, BK, BV).to(tl.float32)
    for i_t in range(NT):
        r0 = i_t * BT
        m_t = r0 + ot < L
        if SAVE:
            p_h = h + ((boh + i_t).to(tl.int64) * HV + i_hv) * K * V
            store_tile(p_h, S, 0, K, V, i_v * BV, V, BK, BV)
        b_q = load_tile(q + k_base, r0, L, H * K, 0, K, BT, BK)
        b_kt = tl.load(
            k + k_base + (r0 + ot)[None, :].to(tl.int64) * (H * K) + ok[:, None],
            mask=m_t[None, :] & (ok < K)[:, None],
            other=0.0,
        )
        b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BK, GATE)
        gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
        S16 = cast(S, DT)
        qs = mm(b_q, S16, DOT) * (gam * scale)[:, None]
        if WU:
            b_w = load_tile(w + w_base, r0, L, HV * K, 0, K, BT, BK)
            b_u = load_tile(u + v_base, r0, L, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
            un = b_u - mm(b_w, S16, DOT)
        else:
            b_k = load_tile(k + k_base, r0, L, H * K, 0, K, BT, BK)
            b_v = load_tile(v + v_base, r0, L, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
            b_beta = tl.load(beta + (bos + r0 + ot).to(tl.int64) * HV + i_hv, mask=m_t, other=0.0)
            ks = mm(b_k, S16, DOT) * gam[:, None]
            # U' = T Diag(β) (V − (K ⊙ γ) S); padded rows of T are 0, so their U' is 0.
            b_T = load_square(Ainv, bos + r0, eos, i_hv, HV, BT, False)
            un = mm_xx(b_T, (b_v - ks) * b_beta.to(tl.float32)[:, None], DT, PREC, DOT)
        if SAVE:
            store_tile(vnew + v_base, un, r0, L, HV * V, i_v * BV, V, BT, BV)
        keep = (ot[:, None] >= ot[None, :]) & m_t[:, None]
        b_P = mm(b_q, b_kt, DOT) * scale
        b_P = tl.where(keep, b_P * tl.exp(tl.where(keep, b_g[:, None] - b_g[None, :], 0.0)), 0.0)
        b_o = qs + mm_xx(b_P, un, DT, PREC, DOT)
        store_tile(o + v_base, b_o, r0, L, HV * V, i_v * BV, V, BT, BV)
        S = S * gam_c + mm_xx(b_kt.to(tl.float32), un * to_end[:, None], DT, PREC, DOT)
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
    q,
    k,
    v,
    gcum,
    beta,
    Ainv,
    w,
    u,
    h0,
    h,
    vnew,
    o,
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
    SAVE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
    WU: tl.constexpr,
    EARLY_P: tl.constexpr = 0,
):
    """`delta_ho_fwd_kernel` with the state held transposed, Sᵀ `[BV, K]` (the fused scan by
    default; LT2_DELTA_TSTATE=0 runs the other):
    every dot on the recurrence takes the computed tile as its left operand and a tile loaded
    from memory as its right one,

        U'ᵀ = (Vᵀ − (Sᵀ Kᵀ) ⊙ γ) Diag(β) Tᵀ,   Oᵀ = (Sᵀ sQᵀ) ⊙ γ + U'ᵀ Pᵀ,
        Sᵀ ← γ_C Sᵀ + (U'ᵀ ⊙ e^{b_C − b}) K,

    because Hopper's wgmma reads its left operand from registers and its right one only from
    shared memory: written as S, the state and U' are right operands and go through shared memory
    on every chunk. Kᵀ, Qᵀ, Vᵀ and Tᵀ are read through transposed pointers, Pᵀ = s K Qᵀ ⊙ Γᵀ is
    formed directly, and the stores of O, U' and S_c write the transposed tiles to the usual
    layouts, so the buffers are those of the other scans.

    EARLY_P (a candidate config, LT2_DELTA_CANDIDATES=1) reorders the chunk's work around the
    recurrence: P first (it depends on inputs only), then the dots into U' and the next state,
    and the output's dots (Q·S, P·U') after those, so their issue and latency are off the path
    from one chunk's state to the next."""
    tl.static_assert(GATE <= 1, "the fused scan takes no gate or a scalar one")
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, eos, NT, boh = seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    DT = k.dtype.element_ty
    L = eos - bos
    b64 = bos.to(tl.int64)
    k_base = (b64 * H + i_h) * K
    w_base = (b64 * HV + i_hv) * K
    v_base = (b64 * HV + i_hv) * V
    s_base = i_nh.to(tl.int64) * K * V
    ot = tl.arange(0, BT)

    St = tl.zeros([BV, BK], dtype=tl.float32)
    if USE_H0:
        St += load_tile_t(h0 + s_base, 0, K, V, i_v * BV, V, BK, BV).to(tl.float32)
    for i_t in range(NT):
        r0 = i_t * BT
        m_t = r0 + ot < L
        if SAVE:
            p_h = h + ((boh + i_t).to(tl.int64) * HV + i_hv) * K * V
            store_tile_t(p_h, St, 0, K, V, i_v * BV, V, BK, BV)
        b_qt = load_tile_t(q + k_base, r0, L, H * K, 0, K, BT, BK)
        b_k = load_tile(k + k_base, r0, L, H * K, 0, K, BT, BK)
        if GATE == 1:
            b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BK, GATE)
            gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
        else:  # DeltaNet: γ = 1, never formed (placeholders the helpers do not read)
            b_g = tl.zeros([BT], dtype=tl.float32)
            gam, to_end, gam_c = b_g, b_g, 1.0
        if EARLY_P:
            b_P = _scores_t(b_k, b_qt, b_g, m_t, scale, BT, GATE, DOT)
        S16 = cast(St, DT)
        if not EARLY_P:
            qs = _scaled_cols(mm(S16, b_qt, DOT), gam, scale, GATE)
        if WU:
            b_wt = load_tile_t(w + w_base, r0, L, HV * K, 0, K, BT, BK)
            b_u = load_tile_t(u + v_base, r0, L, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
            un = b_u - mm(S16, b_wt, DOT)
        else:
            b_kt = load_tile_t(k + k_base, r0, L, H * K, 0, K, BT, BK)
            b_v = load_tile_t(v + v_base, r0, L, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
            b_beta = tl.load(beta + (bos + r0 + ot).to(tl.int64) * HV + i_hv, mask=m_t, other=0.0)
            ks = _gated_cols(mm(S16, b_kt, DOT), gam, GATE)
            # padded columns of Tᵀ are 0, so their U' is 0 and adds nothing to the state
            b_Tt = load_tile_t(Ainv + (bos + r0).to(tl.int64) * HV * BT + i_hv * BT, 0, L - r0, HV * BT,
                               0, BT, BT, BT)  # fmt: skip
            un = mm_xx((b_v - ks) * b_beta.to(tl.float32)[None, :], b_Tt, DT, PREC, DOT)
        if EARLY_P:
            # the next state's dots first, the output's after them: off the recurrence's path
            St_next = _state_step_t(St, un, b_k, gam_c, to_end, DT, PREC, GATE, DOT)
            qs = _scaled_cols(mm(S16, b_qt, DOT), gam, scale, GATE)
        if SAVE:
            store_tile_t(vnew + v_base, un, r0, L, HV * V, i_v * BV, V, BT, BV)
        if not EARLY_P:
            b_P = _scores_t(b_k, b_qt, b_g, m_t, scale, BT, GATE, DOT)
        b_o = qs + mm_xx(un, b_P, DT, PREC, DOT)
        store_tile_t(o + v_base, b_o, r0, L, HV * V, i_v * BV, V, BT, BV)
        if EARLY_P:
            St = St_next
        else:
            St = _state_step_t(St, un, b_k, gam_c, to_end, DT, PREC, GATE, DOT)
    if STORE_FINAL:
        store_tile_t(ht + s_base, St, 0, K, V, i_v * BV, V, BK, BV)


@triton.jit
def delta_o_fwd_kernel(
    q,
    k,
    gcum,
    Aqk,
    h,
    un32,
    o,
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
    PREC: tl.constexpr,
):
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    _, i_t, bos, eos = chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    i_g = i_c if IS_VARLEN else i_b * tl.cdiv(T, BT) + i_c
    t0 = bos + i_t * BT
    n = eos - t0
    DT = q.dtype.element_ty
    t64 = t0.to(tl.int64)
    qk_base = (t64 * H + i_h) * K
    v_base = (t64 * HV + i_hv) * V

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


@triton.jit
def delta_du0_kernel(
    q,
    k,
    gcum,
    Aqk,
    do,
    du0,
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
    PREC: tl.constexpr,
):
    """The chunk-local part of dU', Pᵀ dO `[B*T, HV, V]` fp32, for every chunk at once (backward of
    the output's intra-chunk term; the reverse scan adds (K ⊙ e^{b_C − b}) dS')."""
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    _, i_t, bos, eos = chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    t0 = bos + i_t * BT
    n = eos - t0
    DT = q.dtype.element_ty
    t64 = t0.to(tl.int64)
    qk_base = (t64 * H + i_h) * K
    v_base = (t64 * HV + i_hv) * V
    if GATE == 1:
        b_g, _ = load_chunk_gate(gcum, t0, eos, i_hv, HV, K, BT, BK, GATE)
        b_q = load_tile(q + qk_base, 0, n, H * K, 0, K, BT, BK)
        b_k = load_tile(k + qk_base, 0, n, H * K, 0, K, BT, BK)
        b_Pt = causal_scores(b_k, b_q, b_g, n, scale, BT, True, True, DOT)
    else:
        b_Pt = load_square(Aqk, t0, eos, i_hv, HV, BT, True)
    if GATE == 1:
        # dO stays a raw 16-bit operand and Pᵀ enters as hi + lo halves (finer than TF32, and no
        # fp32 copy of dO through shared memory)
        b_do = load_tile(do + v_base, 0, n, HV * V, i_v * BV, V, BT, BV)
        b_du0 = mm_xr(b_Pt, b_do, DT, PREC, DOT)
    else:  # KDA keeps the form its GPU tests and timings ran with
        b_do = load_tile(do + v_base, 0, n, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
        b_du0 = mm_xx(b_Pt, b_do, DT, PREC, DOT)
    store_tile(du0 + v_base, b_du0, 0, n, HV * V, i_v * BV, V, BT, BV)


@triton.jit
def delta_dh_bwd_kernel(
    q,
    k,
    w,
    gcum,
    do,
    du0,
    dht,
    dh,
    du,
    dh0,
    Ainv,
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
    PREC: tl.constexpr,
    D16: tl.constexpr = False,
    FORM_Y: tl.constexpr = False,
    FORM_DU0: tl.constexpr = False,
):
    """Reverse scan of the split backward: the forward scan's two-dot shape, with W.

    dU' = Pᵀ dO + (K ⊙ e^{b_C − b}) dS' (Pᵀ dO from `delta_du0_kernel`), stored in `du` (fp32);
    dS ← Diag(γ_C) dS' + (sQ ⊙ γ)ᵀ dO − Wᵀ dU', since (K ⊙ γ)ᵀ Diag(β) Tᵀ = Wᵀ. Y = Tᵀ dU' for the
    gradient kernels is formed afterwards for all chunks at once (`delta_y_kernel`), off the
    sequential path. Wᵀ is loaded transposed from memory (no register transpose of a raw tile).

    With D16 (LT2_DELTA_BWD16, 16-bit inputs) the state update's dots take 16-bit operands where
    they otherwise round fp32 ones to TF32: Wᵀ raw against dU' as hi + lo halves, and Qᵀ dO on the
    raw tiles with s applied to the product (GATE 0) or sQ ⊙ γ as hi + lo halves (GATE 1). GATE 0
    (DeltaNet) has no gate loads or factors at all.

    With FORM_Y (LT2_DELTA_Y_IN_SCAN=1) `du` receives Y = Tᵀ dU' itself, formed here off the
    recurrence's dependency chain from dU' rounded to du's dtype (as `delta_y_kernel` reads it),
    so the separate pass over dU' and T is not run.

    With FORM_DU0 (LT2_DELTA_DU0_IN_SCAN=1; DeltaNet and GDN) Pᵀ dO is formed here from the Q, K
    and dO tiles the step loads anyway (off the dependency chain; `du0` is not read), so the
    chunk-parallel `delta_du0_kernel` pass and its scratch are not needed.
    """
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, eos, NT, boh = seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    DT = q.dtype.element_ty
    L = eos - bos
    b64 = bos.to(tl.int64)
    qk_base = (b64 * H + i_h) * K
    w_base = (b64 * HV + i_hv) * K
    v_base = (b64 * HV + i_hv) * V
    s_base = i_nh.to(tl.int64) * K * V
    ok = tl.arange(0, BK)
    ot = tl.arange(0, BT)

    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dS += load_tile(dht + s_base, 0, K, V, i_v * BV, V, BK, BV).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        r0 = i_t * BT
        p_h = dh + ((boh + i_t).to(tl.int64) * HV + i_hv) * K * V
        store_tile(p_h, dS, 0, K, V, i_v * BV, V, BK, BV)
        b_k = load_tile(k + qk_base, r0, L, H * K, 0, K, BT, BK)
        b_q = load_tile(q + qk_base, r0, L, H * K, 0, K, BT, BK)
        if D16:
            b_do = load_tile(do + v_base, r0, L, HV * V, i_v * BV, V, BT, BV)
        else:
            b_do = load_tile(do + v_base, r0, L, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
        if GATE == 0:
            kds = mm(b_k, cast(dS, DT), DOT)
        else:
            b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BK, GATE)
            gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
            if GATE == 1:
                gam, to_end = gam[:, None], to_end[:, None]
            kds = mm(cast(b_k.to(tl.float32) * to_end, DT), cast(dS, DT), DOT)
        if FORM_DU0:
            tl.static_assert(GATE < 2, "Pᵀ dO in the reverse scan: scalar gate or none")
            if GATE == 1:
                b_Pt = causal_scores(b_k, b_q, b_g, L - r0, scale, BT, True, True, DOT)
            else:
                b_Pt = causal_scores(b_k, b_q, ot, L - r0, scale, BT, False, True, DOT)
            if D16:  # as `delta_du0_kernel`: raw dO against Pᵀ as hi + lo halves
                b_du = mm_xr(b_Pt, b_do, DT, PREC, DOT) + kds
            else:
                b_du = mm_xx(b_Pt, b_do, DT, PREC, DOT) + kds
        else:
            b_du = load_tile(du0 + v_base, r0, L, HV * V, i_v * BV, V, BT, BV) + kds
        if FORM_Y:
            b_Tt = load_square(Ainv, bos + r0, eos, i_hv, HV, BT, True)
            b_y = mm_xb(b_Tt, cast(b_du, du.dtype.element_ty), DT, PREC, DOT)
            store_tile(du + v_base, b_y, r0, L, HV * V, i_v * BV, V, BT, BV)
        else:
            store_tile(du + v_base, b_du, r0, L, HV * V, i_v * BV, V, BT, BV)
        p_wt = w + w_base + (r0 + ot)[None, :].to(tl.int64) * (HV * K) + ok[:, None]
        m_wt = (r0 + ot < L)[None, :] & (ok < K)[:, None]
        if D16:
            b_wt = tl.load(p_wt, mask=m_wt, other=0.0)
            if GATE == 0:
                dS += mm(tl.trans(b_q), b_do, DOT) * scale
            else:
                q_hi, q_lo = split16(b_q.to(tl.float32) * (gam * scale), DT)
                dS = dS * gam_c + mm(tl.trans(q_hi), b_do, DOT) + mm(tl.trans(q_lo), b_do, DOT)
            u_hi, u_lo = split16(b_du, DT)
            dS -= mm(b_wt, u_hi, DOT) + mm(b_wt, u_lo, DOT)
        else:
            b_wt = tl.load(p_wt, mask=m_wt, other=0.0).to(tl.float32)
            if GATE == 0:
                dS += mm_xx(tl.trans(b_q.to(tl.float32) * scale), b_do, DT, PREC, DOT)
            else:
                dS = dS * gam_c + mm_xx(tl.trans(b_q.to(tl.float32) * (gam * scale)), b_do, DT, PREC, DOT)
            dS -= mm_xx(b_wt, b_du, DT, PREC, DOT)
    if STORE_DH0:
        store_tile(dh0 + s_base, dS, 0, K, V, i_v * BV, V, BK, BV)


@triton.jit
def delta_dht_bwd_kernel(
    q,
    k,
    w,
    gcum,
    do,
    du0,
    dht,
    dh,
    du,
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
    PREC: tl.constexpr,
):
    """`delta_dh_bwd_kernel` with the state gradient held transposed, dSᵀ `[BV, K]`
    (LT2_DELTA_TSTATE_BWD=1; the scalar gate), as `delta_hot_fwd_kernel` holds the state:

        dU'ᵀ = (Pᵀ dO)ᵀ + (dS'ᵀ Kᵀ) ⊙ e^{b_C − b},   dSᵀ ← γ_C dS'ᵀ + (dOᵀ ⊙ sγ) Q − dU'ᵀ W

    The computed tiles (dSᵀ, dOᵀ ⊙ sγ, dU'ᵀ) are the dots' left operands, read from registers on
    Hopper; Kᵀ, Q and W come from memory as right operands, raw. The fp32 left operands of the
    state update enter as hi + lo 16-bit halves (`mm_xr`) where the untransposed scan rounds them
    to TF32, and K·dS takes the raw keys with the gate applied to its result."""
    tl.static_assert(GATE == 1, "the transposed reverse scan takes the scalar-gate code only")
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, eos, NT, boh = seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    DT = q.dtype.element_ty
    L = eos - bos
    b64 = bos.to(tl.int64)
    qk_base = (b64 * H + i_h) * K
    w_base = (b64 * HV + i_hv) * K
    v_base = (b64 * HV + i_hv) * V
    s_base = i_nh.to(tl.int64) * K * V

    dSt = tl.zeros([BV, BK], dtype=tl.float32)
    if USE_DHT:
        dSt += load_tile_t(dht + s_base, 0, K, V, i_v * BV, V, BK, BV).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        r0 = i_t * BT
        p_h = dh + ((boh + i_t).to(tl.int64) * HV + i_hv) * K * V
        store_tile_t(p_h, dSt, 0, K, V, i_v * BV, V, BK, BV)
        b_kt = load_tile_t(k + qk_base, r0, L, H * K, 0, K, BT, BK)
        b_q = load_tile(q + qk_base, r0, L, H * K, 0, K, BT, BK)
        b_w = load_tile(w + w_base, r0, L, HV * K, 0, K, BT, BK)
        b_dot = load_tile_t(do + v_base, r0, L, HV * V, i_v * BV, V, BT, BV).to(tl.float32)
        b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BK, GATE)
        gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
        kds = mm(cast(dSt, DT), b_kt, DOT) * to_end[None, :]
        b_du = load_tile_t(du0 + v_base, r0, L, HV * V, i_v * BV, V, BT, BV) + kds
        store_tile_t(du + v_base, b_du, r0, L, HV * V, i_v * BV, V, BT, BV)
        dSt = dSt * gam_c + mm_xr(b_dot * (gam * scale)[None, :], b_q, DT, PREC, DOT)
        dSt -= mm_xr(b_du, b_w, DT, PREC, DOT)
    if STORE_DH0:
        store_tile_t(dh0 + s_base, dSt, 0, K, V, i_v * BV, V, BK, BV)


@triton.jit
def delta_y_kernel(
    Ainv,
    du,
    Y,
    beta,
    dv,
    cu_seqlens,
    chunk_indices,
    T,
    HV: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
    DT: tl.constexpr,
    STORE_DV: tl.constexpr = False,
):
    """Y = Tᵀ dU' `[B*T, HV, V]` per (V tile, chunk), and with STORE_DV dv = β ⊙ Y from Y before it
    is rounded to a 16-bit buffer (LT2_DELTA_BWD_LP; with fp32 scratch the C x C kernel writes dv).
    Out of place: the autotuner runs a kernel several times on the same buffers, so no autotuned
    kernel may read what it writes."""
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    _, i_t, bos, eos = chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    t0 = bos + i_t * BT
    n = eos - t0
    off = (t0.to(tl.int64) * HV + i_hv) * V
    b_du = load_tile(du + off, 0, n, HV * V, i_v * BV, V, BT, BV)
    b_Tt = load_square(Ainv, t0, eos, i_hv, HV, BT, True)
    b_y = mm_xb(b_Tt, b_du, DT, PREC, DOT)
    store_tile(Y + off, b_y, 0, n, HV * V, i_v * BV, V, BT, BV)
    if STORE_DV:
        ot = tl.arange(0, BT)
        b_beta = tl.load(beta + (t0 + ot).to(tl.int64) * HV + i_hv, mask=ot < n, other=0.0).to(tl.float32)
        store_tile(dv + off, b_y * b_beta[:, None], 0, n, HV * V, i_v * BV, V, BT, BV)
