"""The W-based backward of the delta-rule family's state: Pᵀ dO, W, the reverse scan, Y.

Per chunk (b, γ, T, P as in `scan`): `delta_du0_kernel` forms Pᵀ dO for all chunks at once,
`delta_w_kernel` recomputes W = T Diag(β)(K ⊙ γ), `delta_dh_bwd_kernel` carries the state gradient
from the last chunk back with two dots on its sequential path, and `delta_y_kernel` forms
Y = Tᵀ dU' for all chunks at once. The per-chunk input gradients follow in `grad`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.tl_util import cast
from lt2dsl.kernels.delta.helpers import (
    causal_scores,
    chunk_head,
    chunk_tile_program,
    mm,
    mm_xr,
    mm_xx,
    seq_program,
    split16,
)
from lt2dsl.kernels.delta.tiles import gate_factors, load_chunk_gate, load_square, load_tile, store_tile


@triton.jit
def delta_w_kernel(
    k, gcum, beta, Ainv, w, cu_seqlens, chunk_indices, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    GATE: tl.constexpr, IS_VARLEN: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """W = T Diag(β) (K ⊙ γ) `[B*T, HV, K]` of one chunk, in the input dtype, for the reverse scan
    (recomputed rather than kept from the forward)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_hv, i_h, i_t, bos, eos, _ = chunk_head(i_c, i_bh, cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
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


@triton.jit
def delta_du0_kernel(
    q, k, gcum, Aqk, do, du0, cu_seqlens, chunk_indices, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The chunk-local part of dU', Pᵀ dO `[B*T, HV, V]` fp32, for every chunk at once (backward of
    the output's intra-chunk term; the reverse scan adds (K ⊙ e^{b_C − b}) dS')."""
    i_v, i_hv, i_h, _, t0, eos, n, qk_base, v_base = chunk_tile_program(
        cu_seqlens, chunk_indices, T, H, HV, K, V, BT, IS_VARLEN
    )
    DT = q.dtype.element_ty
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
    q, k, w, gcum, do, du0, dht, dh, du, dh0, cu_seqlens, chunk_offsets, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GATE: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr, D16: tl.constexpr,
):  # fmt: skip
    """The reverse state scan: the forward scan's two-dot shape, with W.

    dU' = Pᵀ dO + (K ⊙ e^{b_C − b}) dS' (Pᵀ dO from `delta_du0_kernel`), stored in `du` (fp32);
    dS ← Diag(γ_C) dS' + (sQ ⊙ γ)ᵀ dO − Wᵀ dU', since (K ⊙ γ)ᵀ Diag(β) Tᵀ = Wᵀ. Y = Tᵀ dU' for the
    gradient kernels is formed afterwards for all chunks at once (`delta_y_kernel`), off the
    sequential path. Wᵀ is loaded transposed from memory (no register transpose of a raw tile).

    D16 (DeltaNet, GATE 0, with 16-bit inputs): the state update's dots take 16-bit operands where
    they otherwise round fp32 ones to TF32: Wᵀ raw against dU' as hi + lo halves, and Qᵀ dO on the
    raw tiles with s applied to the product. GATE 0 has no gate loads or factors at all.
    """
    tl.static_assert(GATE == 0 or not D16, "the 16-bit reverse scan is the gate-free one")
    i_v, i_nh, i_hv, i_h, bos, eos, NT, boh, L, b64, qk_base, v_base, s_base = seq_program(
        cu_seqlens, chunk_offsets, T, H, HV, K, V, BT, IS_VARLEN
    )
    DT = q.dtype.element_ty
    w_base = (b64 * HV + i_hv) * K
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
        b_du = load_tile(du0 + v_base, r0, L, HV * V, i_v * BV, V, BT, BV) + kds
        store_tile(du + v_base, b_du, r0, L, HV * V, i_v * BV, V, BT, BV)
        p_wt = w + w_base + (r0 + ot)[None, :].to(tl.int64) * (HV * K) + ok[:, None]
        m_wt = (r0 + ot < L)[None, :] & (ok < K)[:, None]
        if D16:
            b_wt = tl.load(p_wt, mask=m_wt, other=0.0)
            dS += mm(tl.trans(b_q), b_do, DOT) * scale
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
def delta_y_kernel(
    Ainv, du, Y, cu_seqlens, chunk_indices, T,
    HV: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, DT: tl.constexpr,
):  # fmt: skip
    """Y = Tᵀ dU' `[B*T, HV, V]` (fp32) per (V tile, chunk). Out of place: the autotuner runs a
    kernel several times on the same buffers, so no autotuned kernel may read what it writes."""
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hv, _, i_t, bos, eos, _ = chunk_head(i_c, i_bh, cu_seqlens, chunk_indices, T, HV, HV, BT, IS_VARLEN)
    t0 = bos + i_t * BT
    n = eos - t0
    off = (t0.to(tl.int64) * HV + i_hv) * V
    b_du = load_tile(du + off, 0, n, HV * V, i_v * BV, V, BT, BV)
    b_Tt = load_square(Ainv, t0, eos, i_hv, HV, BT, True)
    b_y = mm_xx(b_Tt, b_du, DT, PREC, DOT)
    store_tile(Y + off, b_y, 0, n, HV * V, i_v * BV, V, BT, BV)
