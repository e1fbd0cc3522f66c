"""Triton chunked forward of the stabilised mLSTM (`mlstm`), mixers.md §8(b).

Chunk BT = 64; b = chunk-local cumsum of logσ(f̃) `[B, T, H]`, ĩ the input gate (fp32).
`fwd_stab_kernel` forms the recurrent stabiliser m at every chunk start (a max-plus scan over
chunks), then `fwd_state_kernel` carries (C, n) across chunks; `fwd_o_kernel` computes per token
m_r = max(b_r + m_c, max_{j≤r}(b_r − b_j + ĩ_j)), the weights W_rj = e^{b_r − b_j + ĩ_j − m_r},
w_r = e^{b_r + m_c − m_r} (all exponents ≤ 0) and
h_r = num_r / (max(|a_r|, e^{−m_r}) + ε), num_r = w_r q̃_rᵀC_c + Σ_j W_rj (q̃_r·k_j) v_j,
a_r = w_r q̃_r·n_c + Σ_j W_rj (q̃_r·k_j). m_r and a_r are stored for the backward (chunk_bwd.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..common import tiles
from ..common.backend import new_empty, triton_interpreting
from ..common.chunk_dots import state_and_scores
from ..common.tiles import block, cast, dot_precision, load_tile, load_vec, mma, store_tile, store_vec
from ..decay.chunks import Varlen, chunk_local_cumsum, chunk_span, seq_span

_CONFIGS = tiles.CHUNK_CONFIGS  # sm_90 notes at `CHUNK_CONFIGS`
_KEY = ["H", "K", "V", "BK", "BV"]
# The output kernel forms q·n in a loop of its own (`fwd_o_kernel`): formed from the dots' q tile,
# its 4-warp, 2-stage config races in shared memory (h errors of 7-52 on the GPU where every other
# config gives 0.45). Apart, every config is right (`test_gpu_every_autotune_config`).
_O_CONFIGS = _CONFIGS
# Value-tile cap of the output kernel (16-bit inputs). A 128-wide tile forms Q Kᵀ, the weights and
# q·n once per chunk instead of once per 64-wide tile: the mLSTM forward takes 0.576 ms at 4 warps,
# 2 stages against 0.722 with 64-wide tiles (H200, B=4, T=8192, H=16, D=128).
O_BV_CAP = 128


@tiles.device_fn
def head_chunk(
    i_t, i_bh, cu_seqlens, chunk_idx, T, BT: tl.constexpr, H: tl.constexpr, IS_VARLEN: tl.constexpr
):
    """(sequence, head, chunk within the sequence, global chunk, sequence start, sequence length) of
    the program on chunk `i_t` of batch·head `i_bh`."""
    i_b, i_h = i_bh // H, i_bh % H
    i_n, i_c, i_tg, bos, T = chunk_span(i_t, i_b, cu_seqlens, chunk_idx, T, BT, IS_VARLEN)
    return i_n, i_h, i_c, i_tg, bos, T


@tiles.device_fn
def head_seq(
    i_nh, cu_seqlens, chunk_offsets, T,
    BT: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """(sequence, head, sequence start, sequence length, first global chunk, offset of the
    `[K, V]` state in a `[N, H, K, V]` tensor) of the scan program on sequence·head `i_nh`."""
    i_n, i_h = i_nh // H, i_nh % H
    bos, T, boc = seq_span(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    return i_n, i_h, bos, T, boc, i_nh.to(tl.int64) * K * V


@triton.jit
def _maxplus(b1, a1, b2, a2):
    """Compose the chunk maps m ↦ max(m + b1, a1) then m ↦ max(m + b2, a2) (associative)."""
    return b1 + b2, tl.maximum(a1 + b2, a2)


@triton.jit(do_not_specialize=["T"])
def fwd_stab_kernel(
    b, ig, ms, m0, mt, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    HAS_H0: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """The stabiliser entering every chunk (`ms`) and the final one (`mt`) of one (sequence, head).

    Over chunks, m ← max(m + b_C, max_j(ĩ_j + b_C − b_j)): a map m ↦ max(m + β, α) per chunk, so BC
    chunks at a time are one associative scan of (β, α) pairs. Done apart from the state scan, whose
    sequential loop then only loads m (no block-wide max on its critical path).
    """
    i_nh = tl.program_id(0)
    i_n, i_h = i_nh // H, i_nh % H
    bos, T, boc = seq_span(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    b += bos * H + i_h
    ig += bos * H + i_h
    NC = tl.cdiv(T, BT)
    b_m = tl.sum(tl.zeros([1], dtype=tl.float32))
    if HAS_H0:
        b_m += tl.load(m0 + i_nh).to(tl.float32)
    if NC > 0:
        tl.store(ms + boc * H + i_h, b_m)
    o_c = tl.arange(0, BC)
    o_t = tl.arange(0, BT)
    for c0 in range(0, NC, BC):
        cs = c0 + o_c
        in_c = cs < NC
        tok = cs[:, None] * BT + o_t[None, :]
        valid = tok < T
        b_last = tl.load(b + (tl.minimum(cs * BT + BT, T) - 1) * H, mask=in_c, other=0.0)
        b_b = tl.load(b + tok * H, mask=valid, other=0.0)
        b_i = tl.load(ig + tok * H, mask=valid, other=0.0)
        alpha = tl.max(tl.where(valid, b_i + b_last[:, None] - b_b, float("-inf")), axis=1)
        sb, sa = tl.associative_scan((tl.where(in_c, b_last, 0.0), alpha), 0, _maxplus)
        m_after = tl.maximum(b_m + sb, sa)
        tl.store(ms + (boc + cs + 1) * H + i_h, m_after, mask=cs + 1 < NC)
        # chunks past NC are the identity (β = 0, α = −inf): the last entry is the block's composition
        b_m = tl.max(tl.where(o_c == BC - 1, m_after, float("-inf")), axis=0)
    tl.store(mt + i_nh, b_m)


@tiles.tuned(_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def fwd_state_kernel(
    k, v, b, ig, Cs, ns, ms, C0, n0, Ct, nt, mt, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_H0: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """(C, n) entering every chunk and the final (C, n), with the stabilisers `ms`, `mt` read from
    `fwd_stab_kernel` (the key weights and a chunk's decay are elementwise in loaded values, off the
    loop-carried path). The grid's value axis has one entry more than V's blocks: those programs
    scan n alone, so the C programs' loop has no cross-warp row sum of k ⊙ w per chunk (144 -> 104
    registers at 4 warps offline; 586 -> 496 µs for two calls on the H200, B=4, T=8192, H=16).
    Forming the key weights, decays and the normaliser's per-chunk terms in a parallel kernel first
    (as the dh scan's `chunk_bwd.bwd_weights_kernel`) made the forward slower on the H200: 0.80
    against 0.65 ms, fwd+bwd 2.90 against 2.87 (BENCHMARKS.md, mLSTM)."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n, i_h, bos, T, boc, p_state = head_seq(i_nh, cu_seqlens, chunk_offsets, T, BT, H, K, V, IS_VARLEN)
    k += (bos * H + i_h) * K
    v += (bos * H + i_h) * V
    o_k = i_k * BK + tl.arange(0, BK)
    if i_v < tl.cdiv(V, BV):
        b_C = tl.zeros([BK, BV], dtype=tl.float32)
        if HAS_H0:
            b_C += load_tile(C0 + p_state, i_k * BK, i_v * BV, K, V, V, 1, BK, BV).to(tl.float32)
        for i_t in range(tl.cdiv(T, BT)):
            store_tile(Cs + ((boc + i_t) * H + i_h) * K * V, b_C, i_k * BK, i_v * BV, K, V, V, 1, BK, BV)
            w, decay, _ = _key_weights(b, ig, ms, mt, bos, i_n, i_t, boc + i_t, i_h, T, H, BT)
            b_kT = load_tile(k, i_k * BK, i_t * BT, K, T, 1, H * K, BK, BT)
            b_v = load_tile(v, i_t * BT, i_v * BV, T, V, H * V, 1, BT, BV)
            b_kw = b_kT.to(tl.float32) * w[None, :]
            b_C = decay * b_C + mma(cast(b_kw, b_kT.dtype), b_v, PREC)
        store_tile(Ct + p_state, b_C, i_k * BK, i_v * BV, K, V, V, 1, BK, BV)
    else:
        b_n = tl.zeros([BK], dtype=tl.float32)
        if HAS_H0:
            b_n += tl.load(n0 + i_nh.to(tl.int64) * K + o_k, mask=o_k < K, other=0.0).to(tl.float32)
        for i_t in range(tl.cdiv(T, BT)):
            tl.store(ns + ((boc + i_t) * H + i_h) * K + o_k, b_n, mask=o_k < K)
            w, decay, _ = _key_weights(b, ig, ms, mt, bos, i_n, i_t, boc + i_t, i_h, T, H, BT)
            b_kT = load_tile(k, i_k * BK, i_t * BT, K, T, 1, H * K, BK, BT)
            b_n = decay * b_n + tl.sum(b_kT.to(tl.float32) * w[None, :], axis=1)
        tl.store(nt + i_nh.to(tl.int64) * K + o_k, b_n, mask=o_k < K)


@tiles.device_fn
def _key_weights(b, ig, ms, mt, bos, i_n, i_c, i_tg, i_h, T, H, BT: tl.constexpr):
    """(w_k `[BT]` = e^{b_C − b_j + ĩ_j − m_{c+1}}, decay = e^{b_C + m_c − m_{c+1}}, m_c) of chunk i_c."""
    o_t = i_c * BT + tl.arange(0, BT)
    last = tl.minimum(i_c * BT + BT, T) - 1
    b_b = load_vec(b + bos * H + i_h, i_c * BT, T, H, BT)
    b_i = load_vec(ig + bos * H + i_h, i_c * BT, T, H, BT)
    b_blast = tl.load(b + (bos + last) * H + i_h)
    b_mc = tl.load(ms + i_tg * H + i_h)
    # a pointer select, not a branch: control flow in the scans' loop bodies keeps Triton's
    # pipeliner from prefetching the next chunk's loads
    last_chunk = (i_c + 1) * BT >= T
    b_mnext = tl.load(tl.where(last_chunk, mt + i_n * H + i_h, ms + (i_tg + 1) * H + i_h))
    expo = tl.where(o_t < T, b_blast - b_b + b_i - b_mnext, float("-inf"))
    return tl.exp(expo), tl.exp(b_blast + b_mc - b_mnext), b_mc


@tiles.tuned(_O_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def fwd_o_kernel(
    q, k, v, b, ig, Cs, ns, ms, o, m_tok, a_tok, cu_seqlens, chunk_idx, scale, eps, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _, i_h, i_c, i_tg, bos, T = head_chunk(i_t, i_bh, cu_seqlens, chunk_idx, T, BT, H, IS_VARLEN)
    i_s = i_tg * H + i_h
    b_mc = tl.load(ms + i_s)
    q += (bos * H + i_h) * K
    k += (bos * H + i_h) * K
    b_num, b_S = state_and_scores(q, k, Cs + i_s * K * V, i_c, i_v, T, H, K, V, BT, BK, BV, PREC, False)
    b_qn = tl.zeros([BT], dtype=tl.float32)
    # q·n in a loop of its own, from its own loads. Read from the q tile the dots take, it gave that
    # tile a non-dot use, and Triton's pipeliner then kept one shared-memory copy of q at 2 stages
    # and prefetched the next K step's q into it while the asynchronous dots still read it (the sm_90
    # TTGIR shows q with 1 buffer, k and C with 2, `warp_group_dot_wait {pendings = 2}` before the
    # copy). As a tensor-core dot, q [BT, BK] · N [BK, 16] gives wrong bf16 output at D = 64.
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        b_qe = load_tile(q, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK)
        b_n = tl.load(ns + i_s * K + o_k, mask=o_k < K, other=0.0)
        b_qn += tl.sum(b_qe.to(tl.float32) * b_n[None, :], axis=1)
    b_m, b_W, b_w = _weights(b, ig, bos, i_c, i_h, b_mc, T, H, BT)
    b_P = b_S * scale * b_W
    b_v = load_tile(v + (bos * H + i_h) * V, i_c * BT, i_v * BV, T, V, H * V, 1, BT, BV)
    b_num = b_w[:, None] * b_num * scale + mma(cast(b_P, b_v.dtype), b_v, PREC)
    b_a = b_w * b_qn * scale + tl.sum(b_P, axis=1)
    b_inv = 1.0 / (tl.maximum(tl.abs(b_a), tl.exp(-b_m)) + eps)
    store_tile(o + (bos * H + i_h) * V, b_num * b_inv[:, None], i_c * BT, i_v * BV, T, V, H * V, 1, BT, BV)
    if i_v == 0:
        store_vec(m_tok + bos * H + i_h, b_m, i_c * BT, T, H, BT)
        store_vec(a_tok + bos * H + i_h, b_a, i_c * BT, T, H, BT)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@tiles.device_fn
def _weights(b, ig, bos, i_c, i_h, b_mc, T, H, BT: tl.constexpr):
    """(m_r `[BT]`, W `[BT, BT]`: W_rj = e^{b_r − b_j + ĩ_j − m_r} for j ≤ r, w_r = e^{b_r + m_c − m_r}).

    m_r = max(b_r + m_c, max_{j≤r}(b_r − b_j + ĩ_j)) = b_r + M_r, M_r = max(m_c, max_{j≤r}(ĩ_j − b_j)):
    a running max along the chunk (a scan of a `[BT]` vector), so W_rj = e^{(ĩ_j − b_j) − M_r} and
    w_r = e^{m_c − M_r} need no row max over a `[BT, BT]` tile (exponents ≤ 0 as before).
    """
    o_t = i_c * BT + tl.arange(0, BT)
    valid = o_t < T
    b_b = load_vec(b + bos * H + i_h, i_c * BT, T, H, BT)
    b_i = load_vec(ig + bos * H + i_h, i_c * BT, T, H, BT)
    b_u = tl.where(valid, b_i - b_b, float("-inf"))
    b_M = tl.maximum(tl.associative_scan(b_u, 0, _max), b_mc)
    m_D = (o_t[:, None] >= o_t[None, :]) & valid[:, None] & valid[None, :]
    b_W = tl.exp(tl.where(m_D, b_u[None, :] - b_M[:, None], float("-inf")))
    return b_b + b_M, b_W, tl.where(valid, tl.exp(b_mc - b_M), 0.0)


def _meta(q, v, vl):
    B, T, H, K = q.shape
    V = v.shape[3]
    return dict(H=H, K=K, V=V, BT=vl.chunk, BK=block(K), BV=block(V), IS_VARLEN=vl.is_varlen,
                PREC=dot_precision(q.dtype))  # fmt: skip


def _states(k, v, b, ig, state0, vl):
    """Per-chunk (C, n, m) entering every chunk and the final (C, n, m)."""
    B, T, H, K = k.shape
    V = v.shape[3]
    meta = _meta(k, v, vl)
    Cs = new_empty(k, vl.n_chunks, H, K, V)
    ns = new_empty(k, vl.n_chunks, H, K, dtype=torch.float32)
    ms = new_empty(k, vl.n_chunks, H, dtype=torch.float32)
    Ct = new_empty(k, vl.N, H, K, V, dtype=torch.float32)
    nt = new_empty(k, vl.N, H, K, dtype=torch.float32)
    mt = new_empty(k, vl.N, H, dtype=torch.float32)
    C0, n0, m0 = (None, None, None) if state0 is None else state0
    fwd_stab_kernel[(vl.N * H,)](
        b, ig, ms, m0, mt, vl.cu, vl.offsets, T, H=H, BT=vl.chunk, BC=16 if triton_interpreting() else 64,
        HAS_H0=state0 is not None, IS_VARLEN=vl.is_varlen,
    )  # fmt: skip
    # one more program on the value axis: the normaliser's own scan
    grid = (triton.cdiv(K, meta["BK"]), triton.cdiv(V, meta["BV"]) + 1, vl.N * H)
    fwd_state_kernel[grid](
        k, v, b, ig, Cs, ns, ms, C0, n0, Ct, nt, mt, vl.cu, vl.offsets, T, HAS_H0=state0 is not None, **meta,
    )  # fmt: skip
    return (Cs, ns, ms), (Ct, nt, mt)


def _gates(i, f, vl):
    """fp32 ĩ and the chunk-local cumsum of logσ(f̃), both `[B, T, H]`."""
    return i.float().contiguous(), chunk_local_cumsum(F.logsigmoid(f.float()), vl)


def chunk_mlstm_fwd(q, k, v, i, f, scale, eps, state0, cu_seqlens):
    """Forward: h `[B, T, H, V]`, final (C, n, m) fp32, and m_r, a_r `[B, T, H]` for the backward."""
    B, T, H, K = q.shape
    vl = Varlen(cu_seqlens, B, T)
    ig, b = _gates(i, f, vl)
    (Cs, ns, ms), final = _states(k, v, b, ig, state0, vl)
    # fp32 at 128 wide spills for sm_90 (10 KB per thread at 4 warps offline) and never ran on the H200
    cap = 64 if q.dtype == torch.float32 else O_BV_CAP
    meta = {**_meta(q, v, vl), "BV": block(v.shape[3], cap)}
    o = new_empty(v, *v.shape)
    m_tok = new_empty(q, B, T, H, dtype=torch.float32)
    a_tok = new_empty(q, B, T, H, dtype=torch.float32)
    grid = (triton.cdiv(v.shape[3], meta["BV"]), vl.NT, vl.grid_rows(B) * H)
    fwd_o_kernel[grid](q, k, v, b, ig, Cs, ns, ms, o, m_tok, a_tok, vl.cu, vl.idx, scale, eps, T, **meta)
    return o, final, m_tok, a_tok
