"""Triton chunked backward of the stabilised mLSTM (`mlstm`), mixers.md §8(b).

With every stabiliser held fixed, num and a (chunk.py) are linear attention with a value column of
ones, so the kernels are simple_gla's with dnum_r = dh_r / den_r and da_r = −(dh_r·h_r)/den_r ·
sign(a_r)[|a_r| > e^{−m_r}]; dlogf and dĩ follow as in simple_gla (dĩ_j = k_j·dk_j). The stabilisers
cancel exactly except through ε: h = N̂ / (max(|Â|, 1) + ε e^{m}), which adds ∂L/∂m_r = ε·dden_r,
routed through m_r = F_r + max(m_0, max_{j≤r}(ĩ_j − F_j)) by `route_and_finish`
(stabiliser_triton.py; its PyTorch reference `route_stabiliser` is in stabiliser.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import new_empty
from ..common.chunk_dots import state_and_scores
from ..common.tiles import (
    block,
    cast,
    device_fn,
    load_tile,
    load_tile_apart,
    load_vec,
    mma,
    store_tile,
    store_vec,
    tuned,
)
from ..decay.chunks import Varlen, chunk_span
from .chunk import _CONFIGS, _KEY, _gates, _key_weights, _meta, _states, head_chunk, head_seq
from .stabiliser_triton import route_and_finish


@device_fn
def _weights_m(b, ig, m_tok, b_mc, bos, i_c, i_h, T, H, BT: tl.constexpr):
    """(W `[BT, BT]`, w `[BT]`) of `chunk._weights` from the forward's stored m_r (no running max;
    the untransposed twin of `_weights_T`)."""
    o_t = i_c * BT + tl.arange(0, BT)
    valid = o_t < T
    b_b = load_vec(b + bos * H + i_h, i_c * BT, T, H, BT)
    b_i = load_vec(ig + bos * H + i_h, i_c * BT, T, H, BT)
    b_m = load_vec(m_tok + bos * H + i_h, i_c * BT, T, H, BT)
    m_D = (o_t[:, None] >= o_t[None, :]) & valid[:, None] & valid[None, :]
    b_W = tl.exp(tl.where(m_D, b_b[:, None] - b_b[None, :] + b_i[None, :] - b_m[:, None], float("-inf")))
    return b_W, _query_weights(b_b, b_m, b_mc, valid)


@device_fn
def _query_weights(b_b, b_m, b_mc, valid):
    """w_r = e^{b_r + m_c − m_r} (0 past the sequence): a token's weight on the chunk's entering state."""
    return tl.where(valid, tl.exp(b_b + b_mc - b_m), 0.0)


@device_fn
def _weights_T(b, ig, m_tok, bos, i_c, i_h, T, H, BT: tl.constexpr):
    """Wᵀ `[BT, BT]`: Wᵀ[j, r] = e^{b_r − b_j + ĩ_j − m_r} for r ≥ j (m_r from the forward)."""
    o_t = i_c * BT + tl.arange(0, BT)
    valid = o_t < T
    b_b = load_vec(b + bos * H + i_h, i_c * BT, T, H, BT)
    b_i = load_vec(ig + bos * H + i_h, i_c * BT, T, H, BT)
    b_m = load_vec(m_tok + bos * H + i_h, i_c * BT, T, H, BT)
    m_D = (o_t[:, None] <= o_t[None, :]) & valid[:, None] & valid[None, :]
    return tl.exp(tl.where(m_D, b_b[None, :] - b_b[:, None] + b_i[:, None] - b_m[None, :], float("-inf")))


@tuned(_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["NTOT"])
def bwd_prep_kernel(
    o, do, m_tok, a_tok, dnum, da, dm, eps, NTOT,
    H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    K: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """Per token: dnum = dh / den (rounded once to the input dtype and stored), and from that same
    rounded dnum: da = −(dnum·h) sign(a)[|a| > e^{−m}], dm = −ε (dnum·h) (fp32).

    Rounding dnum once matters: ds_rj = dnum_r·v_j + da_r nearly cancels when one key dominates
    (h_r ≈ v_j), and only a dnum rounded the same way on both sides keeps the difference accurate.
    """
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    o += i_h * V
    do += i_h * V
    dnum += i_h * V
    b_m = load_vec(m_tok + i_h, i_t * BT, NTOT, H, BT)
    b_a = load_vec(a_tok + i_h, i_t * BT, NTOT, H, BT)
    floor = tl.exp(-b_m)
    b_rden = 1.0 / (tl.maximum(tl.abs(b_a), floor) + eps)
    b_dot = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_o = load_tile(o, i_t * BT, i_v * BV, NTOT, V, H * V, 1, BT, BV).to(tl.float32)
        b_do = load_tile(do, i_t * BT, i_v * BV, NTOT, V, H * V, 1, BT, BV)
        b_dn = cast(b_do.to(tl.float32) * b_rden[:, None], b_do.dtype)
        store_tile(dnum, b_dn, i_t * BT, i_v * BV, NTOT, V, H * V, 1, BT, BV)
        b_dot += tl.sum(b_dn.to(tl.float32) * b_o, axis=1)
    b_da = tl.where(tl.abs(b_a) > floor, tl.where(b_a >= 0, -b_dot, b_dot), 0.0)
    store_vec(da + i_h, b_da, i_t * BT, NTOT, H, BT)
    store_vec(dm + i_h, -eps * b_dot, i_t * BT, NTOT, H, BT)


@tuned(_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def bwd_dh_kernel(
    q, dnum, dCs, dns, dCt, dnt, dC0, dn0, wq, dnl, dec,
    cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Gradients w.r.t. the (C, n) leaving every chunk, walking the chunks backwards. The query
    weights (scale included), the normaliser's per-chunk terms and the decays come from
    `bwd_weights_kernel` (wq, dnl, dec), so the loop has no exponential, no scalar stabiliser load
    and no cross-warp sum (offline sm_90: 11 -> 4 barriers and 6 -> 2 loads outside the pipeline;
    on the H200 mLSTM fwd+bwd 2.874 -> 2.801 ms against forming them in the loop)."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _, i_h, bos, T, boc, p_state = head_seq(i_nh, cu_seqlens, chunk_offsets, T, BT, H, K, V, IS_VARLEN)
    q += (bos * H + i_h) * K
    dnum += (bos * H + i_h) * V
    o_k = i_k * BK + tl.arange(0, BK)
    b_dC = tl.zeros([BK, BV], dtype=tl.float32)
    b_dn = tl.zeros([BK], dtype=tl.float32)
    if HAS_DHT:
        b_dC += load_tile(dCt + p_state, i_k * BK, i_v * BV, K, V, V, 1, BK, BV).to(tl.float32)
        b_dn += tl.load(dnt + i_nh.to(tl.int64) * K + o_k, mask=o_k < K, other=0.0).to(tl.float32)
    n_lim = tl.where(i_v == 0, K, 0)
    for i_t in range(tl.cdiv(T, BT) - 1, -1, -1):
        i_s = (boc + i_t) * H + i_h
        store_tile(dCs + i_s * K * V, b_dC, i_k * BK, i_v * BV, K, V, V, 1, BK, BV)
        # a mask, not a branch, in the loop (as `chunk._key_weights`): the first V block stores dn
        tl.store(dns + i_s * K + o_k, b_dn, mask=o_k < n_lim)
        b_qT = load_tile(q, i_k * BK, i_t * BT, K, T, 1, H * K, BK, BT)
        b_dnum = load_tile(dnum, i_t * BT, i_v * BV, T, V, H * V, 1, BT, BV)
        b_wq = load_vec(wq + bos * H + i_h, i_t * BT, T, H, BT)
        decay = tl.load(dec + i_s)
        b_qw = b_qT.to(tl.float32) * b_wq[None, :]
        b_dC = decay * b_dC + mma(cast(b_qw, b_qT.dtype), cast(b_dnum, b_qT.dtype), PREC)
        b_dn = decay * b_dn + tl.load(dnl + i_s * K + o_k, mask=o_k < K, other=0.0)
    if STORE_DH0:
        store_tile(dC0 + p_state, b_dC, i_k * BK, i_v * BV, K, V, V, 1, BK, BV)
        if i_v == 0:
            tl.store(dn0 + i_nh.to(tl.int64) * K + o_k, b_dn, mask=o_k < K)


@triton.jit(do_not_specialize=["T"])
def bwd_weights_kernel(
    q, b, ig, m_tok, da, ms, mt, wq, dnl, dec, cu_seqlens, chunk_idx, scale, T,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """One chunk, for the dh scan: wq[token] = e^{b_r + m_c − m_r} · scale (0 past the sequence),
    the chunk's decay dec[chunk] = e^{b_C + m_c − m_{c+1}} (as `chunk._key_weights`) and
    dnl[chunk] = Σ_r (q_r wq_r) da_r `[K]`, the normaliser's term of this chunk."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_n, i_c, i_tg, bos, T = chunk_span(i_t, i_b, cu_seqlens, chunk_idx, T, BT, IS_VARLEN)
    i_s = i_tg * H + i_h
    _, decay, b_mc = _key_weights(b, ig, ms, mt, bos, i_n, i_c, i_tg, i_h, T, H, BT)
    tl.store(dec + i_s, decay)
    b_b = load_vec(b + bos * H + i_h, i_c * BT, T, H, BT)
    b_m = load_vec(m_tok + bos * H + i_h, i_c * BT, T, H, BT)
    b_wq = _query_weights(b_b, b_m, b_mc, i_c * BT + tl.arange(0, BT) < T) * scale
    store_vec(wq + bos * H + i_h, b_wq, i_c * BT, T, H, BT)
    b_da = load_vec(da + bos * H + i_h, i_c * BT, T, H, BT)
    q += (bos * H + i_h) * K
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        b_qT = load_tile(q, i_k * BK, i_c * BT, K, T, 1, H * K, BK, BT)
        b_qw = b_qT.to(tl.float32) * b_wq[None, :]
        tl.store(dnl + i_s * K + o_k, tl.sum(b_qw * b_da[None, :], axis=1), mask=o_k < K)


@tuned(_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def bwd_dv_kernel(
    q, k, b, ig, dnum, m_tok, ms, mt, dCs, dv, cu_seqlens, chunk_idx, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dv_j = Σ_{r≥j} W_rj (q̃_r·k_j) dnum_r + w_k_j dC[c]ᵀ k_j (Wᵀ and Aᵀ formed directly,
    `state_and_scores`)."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n, i_h, i_c, i_tg, bos, T = head_chunk(i_t, i_bh, cu_seqlens, chunk_idx, T, BT, H, IS_VARLEN)
    q += (bos * H + i_h) * K
    k += (bos * H + i_h) * K
    i_s = i_tg * H + i_h
    b_dv, b_AT = state_and_scores(k, q, dCs + i_s * K * V, i_c, i_v, T, H, K, V, BT, BK, BV, PREC, True)
    # the key weights scale the rows of k dC, so they apply to the product (as simple_gla's decay):
    # no fp32 copy of k in the loop (219 -> 164 registers per thread at 4 warps, offline sm_90),
    # and k ⊙ w_k is not rounded to 16 bits before the dot
    b_wk, _, _ = _key_weights(b, ig, ms, mt, bos, i_n, i_c, i_tg, i_h, T, H, BT)
    b_dv *= b_wk[:, None]
    b_WT = _weights_T(b, ig, m_tok, bos, i_c, i_h, T, H, BT)
    b_dnum = load_tile(dnum + (bos * H + i_h) * V, i_c * BT, i_v * BV, T, V, H * V, 1, BT, BV)
    b_dv += mma(cast(b_AT * scale * b_WT, b_dnum.dtype), b_dnum, PREC)
    store_tile(dv + (bos * H + i_h) * V, b_dv, i_c * BT, i_v * BV, T, V, H * V, 1, BT, BV)


# dq/dk: ⟨C, dC⟩ reads loads of its own (`load_tile_apart`). Read from the Cᵀ and dCᵀ tiles the dots
# take, Triton's pipeliner keeps one shared buffer for each at 2 stages and refills it while
# asynchronous wgmma dots still read it (bench/ttgir_checks.py), which gave dq errors of 1.6e-2 at
# 8 warps, 2 stages (T = 8192, bf16; the CPU emulation stays at 4e-3). 4 warps spill 1.3 KB per
# thread at 128-wide key tiles.
_DQK_CONFIGS = [triton.Config({}, num_warps=8, num_stages=2), triton.Config({}, num_warps=8, num_stages=3)]


@tuned(_DQK_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def bwd_dqk_kernel(
    q, k, v, b, ig, dnum, m_tok, da, Cs, ns, ms, mt, dCs, dns, dq, dk, dlf, di, ds_scr,
    cu_seqlens, chunk_idx, scale, T, NTOT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dq, dk and this K block's share of dlogf (held-stabiliser part) and dĩ.

    dSᵀ for dk is dS read back transposed from this program's `[BT, BT]` slot of `ds_scr` (the
    16-bit dS the dq dot takes): one accumulator, one dot and two tile loads per value block fewer
    than forming it by a second dot as simple_gla does. Not `tl.trans`: transposing a 16-bit cast
    of a dot accumulator at BK = 64 is the Hopper miscompile of Triton 3.4–3.7.0."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    i_n, i_c, i_tg, bos, T = chunk_span(i_t, i_b, cu_seqlens, chunk_idx, T, BT, IS_VARLEN)
    v += (bos * H + i_h) * V
    dnum += (bos * H + i_h) * V
    i_s = i_tg * H + i_h
    o_k = i_k * BK + tl.arange(0, BK)
    b_ds = tl.zeros([BT, BT], dtype=tl.float32)
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_cdc = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = load_tile(v, i_c * BT, i_v * BV, T, V, H * V, 1, BT, BV)
        b_vT = load_tile(v, i_v * BV, i_c * BT, V, T, 1, H * V, BV, BT)
        b_dnum = load_tile(dnum, i_c * BT, i_v * BV, T, V, H * V, 1, BT, BV)
        # Cᵀ, dCᵀ `[BV, BK]` loaded transposed from the `[K, V]` states
        b_CT = load_tile(Cs + i_s * K * V, i_v * BV, i_k * BK, V, K, 1, V, BV, BK)
        b_dCT = load_tile(dCs + i_s * K * V, i_v * BV, i_k * BK, V, K, 1, V, BV, BK)
        b_ds += mma(b_dnum, b_vT, PREC)
        b_dq += mma(b_dnum, cast(b_CT, b_v.dtype), PREC)
        b_dk += mma(b_v, cast(b_dCT, b_v.dtype), PREC)
        b_CT2 = load_tile_apart(Cs + i_s * K * V, i_v * BV, i_k * BK, V, K, 1, V, BV, BK)
        b_dCT2 = load_tile_apart(dCs + i_s * K * V, i_v * BV, i_k * BK, V, K, 1, V, BV, BK)
        b_cdc += tl.sum(b_CT2.to(tl.float32) * b_dCT2.to(tl.float32), axis=0)

    # the ones column of the normaliser: dS gains da_r in every entry of row r
    b_da = load_vec(da + bos * H + i_h, i_c * BT, T, H, BT)
    b_n = tl.load(ns + i_s * K + o_k, mask=o_k < K, other=0.0)
    b_dn = tl.load(dns + i_s * K + o_k, mask=o_k < K, other=0.0)
    b_mc = tl.load(ms + i_s)
    b_W, b_wq = _weights_m(b, ig, m_tok, b_mc, bos, i_c, i_h, T, H, BT)
    b_wk, decay, _ = _key_weights(b, ig, ms, mt, bos, i_n, i_c, i_tg, i_h, T, H, BT)
    b_ds = (b_ds + b_da[:, None]) * b_W * scale
    b_ds16 = cast(b_ds, ds_scr.dtype.element_ty)
    p_scr = ds_scr + ((i_bh * tl.num_programs(1) + i_t) * tl.num_programs(0) + i_k).to(tl.int64) * BT * BT
    store_tile(p_scr, b_ds16, 0, 0, BT, BT, BT, 1, BT, BT)
    q += (bos * H + i_h) * K
    k += (bos * H + i_h) * K
    b_q = load_tile(q, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK)
    b_k = load_tile(k, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK)
    b_dq_state = (b_dq + b_da[:, None] * b_n[None, :]) * (b_wq * scale)[:, None]
    b_dq = b_dq_state + mma(b_ds16, b_k, PREC)
    b_dk_inter = (b_dk + b_dn[None, :]) * b_wk[:, None]
    # every thread's part of dS is in memory before any thread reads its transpose
    tl.debug_barrier()
    b_dsT16 = load_tile(p_scr, 0, 0, BT, BT, 1, BT, BT, BT)
    b_dk = b_dk_inter + mma(b_dsT16, b_q, PREC)
    # this K block's scores q_r·k_j, to form the intra-chunk part of dF from fp32 dS directly
    b_kT = load_tile(k, i_k * BK, i_c * BT, K, T, 1, H * K, BK, BT)
    b_Sd = b_ds * mma(b_q, b_kT, PREC)
    dq += (bos * H + i_h) * K
    dk += (bos * H + i_h) * K
    store_tile(dq, b_dq, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK)
    store_tile(dk, b_dk, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK)
    b_qf, b_kf = b_q.to(tl.float32), b_k.to(tl.float32)
    b_kdk = tl.sum(b_kf * b_dk, axis=1)
    # q·dq − k·dk without the cancellation of two rounded sums: Σ_j S_rj − Σ_s S_sr + state terms
    b_dF = tl.sum(b_Sd, axis=1) - tl.sum(b_Sd, axis=0)
    b_dF += tl.sum(b_qf * b_dq_state, axis=1) - tl.sum(b_kf * b_dk_inter, axis=1)
    # everything after this chunk: ⟨C_{c+1}, dC[c]⟩ + ⟨n_{c+1}, dn[c]⟩ (this K block's share)
    b_z = decay * (tl.sum(b_cdc) + tl.sum(b_n * b_dn)) + tl.sum(b_kf * b_dk_inter)
    b_dlf = tl.sum(b_dF) - tl.cumsum(b_dF, axis=0) + b_dF + b_z
    off = i_k.to(tl.int64) * NTOT * H + bos * H + i_h
    store_vec(dlf + off, b_dlf, i_c * BT, T, H, BT)
    store_vec(di + off, b_kdk, i_c * BT, T, H, BT)


def chunk_mlstm_bwd(q, k, v, i, f, scale, eps, state0, cu_seqlens, o, m_tok, a_tok, do, dstate):
    """Backward: (dq, dk, dv, dĩ, df̃, dC0, dn0, dm0); the state gradients are None without state0.

    `dstate` is (dC_T, dn_T, dm_T) or None (each entry may be None).
    """
    B, T, H, K = q.shape
    V = v.shape[3]
    vl = Varlen(cu_seqlens, B, T)
    meta = _meta(q, v, vl)
    ig, b = _gates(i, f, vl)
    (Cs, ns, ms), (Ct, nt, mt) = _states(k, v, b, ig, state0, vl)
    da, dm = (new_empty(q, B, T, H, dtype=torch.float32) for _ in range(2))
    dnum = new_empty(do, *do.shape)
    NTOT, BT = B * T, vl.chunk
    prep = dict(H=H, V=V, BT=BT, BV=meta["BV"], K=K, BK=meta["BK"])
    bwd_prep_kernel[(triton.cdiv(NTOT, BT), H)](o, do, m_tok, a_tok, dnum, da, dm, eps, NTOT, **prep)
    dCt, dnt, dmt = (None, None, None) if dstate is None else dstate
    has_dht = dCt is not None or dnt is not None
    if has_dht:
        dCt = torch.zeros_like(Ct) if dCt is None else dCt.float().contiguous()
        dnt = torch.zeros_like(nt) if dnt is None else dnt.float().contiguous()
    dCs = new_empty(q, vl.n_chunks, H, K, V)
    dns = new_empty(q, vl.n_chunks, H, K, dtype=torch.float32)
    dC0 = new_empty(q, vl.N, H, K, V, dtype=torch.float32) if state0 is not None else None
    dn0 = new_empty(q, vl.N, H, K, dtype=torch.float32) if state0 is not None else None
    rows = vl.grid_rows(B) * H
    wq = new_empty(q, B, T, H, dtype=torch.float32)
    dnl = new_empty(q, vl.n_chunks, H, K, dtype=torch.float32)
    dec = new_empty(q, vl.n_chunks, H, dtype=torch.float32)
    bwd_weights_kernel[(vl.NT, rows)](
        q, b, ig, m_tok, da, ms, mt, wq, dnl, dec, vl.cu, vl.idx, scale, T,
        H=H, K=K, BT=BT, BK=meta["BK"], IS_VARLEN=vl.is_varlen,
    )  # fmt: skip
    grid = (triton.cdiv(K, meta["BK"]), triton.cdiv(V, meta["BV"]), vl.N * H)
    bwd_dh_kernel[grid](
        q, dnum, dCs, dns, dCt, dnt, dC0, dn0, wq, dnl, dec, vl.cu, vl.offsets, T,
        HAS_DHT=has_dht, STORE_DH0=state0 is not None, **meta,
    )  # fmt: skip
    dv = new_empty(v, *v.shape)
    bwd_dv_kernel[(triton.cdiv(V, meta["BV"]), vl.NT, rows)](
        q, k, b, ig, dnum, m_tok, ms, mt, dCs, dv, vl.cu, vl.idx, scale, T, **meta
    )
    # dq/dk with key tiles up to 128 wide: at K = 128 one program per chunk forms dS once instead
    # of once per 64-wide K block (242 registers at 8 warps offline, no spill; H200, B=4, T=8192,
    # H=16: 869 -> 748 µs)
    meta_qk = dict(meta, BK=block(K, 128))
    NK = triton.cdiv(K, meta_qk["BK"])
    dq, dk = new_empty(q, *q.shape), new_empty(k, *k.shape)
    dlf = new_empty(q, NK, B, T, H, dtype=torch.float32)
    di = new_empty(q, NK, B, T, H, dtype=torch.float32)
    # one [BT, BT] slot per program for dS on its way to its transpose (16-bit inputs: 16-bit)
    ds_scr = q.new_empty(NK * vl.NT * rows, BT, BT)
    bwd_dqk_kernel[(NK, vl.NT, rows)](
        q, k, v, b, ig, dnum, m_tok, da, Cs, ns, ms, mt, dCs, dns, dq, dk, dlf, di, ds_scr,
        vl.cu, vl.idx, scale, T, NTOT, **meta_qk,
    )  # fmt: skip
    # the stabiliser path: ε through every m_r, and the returned final (C, n, m)
    dm_T = None
    if has_dht or dmt is not None:
        dm_T = torch.zeros_like(mt) if dmt is None else dmt.float()
        if has_dht:
            dm_T = dm_T - (dCt * Ct).sum((-2, -1)) - (dnt * nt).sum(-1)
    m0 = None if state0 is None else state0[2]
    df, di, dm0 = route_and_finish(f, ig, dm, dm_T, m0, dlf, di, cu_seqlens)
    if state0 is not None:
        C0, n0, _ = state0
        dm0 = dm0 + (dC0 * C0).sum((-2, -1)) + (dn0 * n0).sum(-1)
    else:
        dm0 = None
    return dq, dk, dv, di, df, dC0, dn0, dm0
