"""Triton chunked forward and backward of gated linear attention (`gla`), mixers.md §3.

Chunk BT = 64, sub-chunk BC = 16; b is the chunk-local cumulative log decay `[B, T, HV, K]` (fp32).
Forward: A = intra-chunk scores `[B, T, HV, BT]` (fp32, `intra_A_kernel`), then
o = s (Q ⊙ e^{b}) h[c] + A V (`o_dv_kernel`); the states h come from decay/chunk_h.py.
A block of query sub-chunk i and key sub-chunk j < i is (Q_i ⊙ e^{b_i − b_n})(K_j ⊙ e^{b_n − b_j})ᵀ
with b_n the decay at the first row of sub-chunk i; every exponent is ≤ 0. A diagonal 16 × 16 block
is a dot through the same reference row when the decay over its sub-chunk, max over channels of
b_n − b_last, is at most `tl_util.diag_span` (the key factor e^{b_n − b} then stays ≤ e^{span}); stronger
decays take the elementwise form with e^{b_r − b_j} (r ≥ j) ≤ 1, so they cannot overflow. The test
is per program and channel slice (a branch, not a per-element select): ordinary gates take the dot.
Backward: dA = dO Vᵀ (`bwd_dA_kernel`), dv = Aᵀ dO + (K ⊙ e^{b_C − b}) dh[c] (`o_dv_kernel`),
dq/dk inside the chunk from dA by the same sub-chunk split (`bwd_dqk_intra_kernel`; for dk the
reference point is the last row of the key sub-chunk), then the state terms and
dg_l = Σ_{t ≥ l in chunk} (q_t ⊙ dq_t − k_t ⊙ dk_t) + e^{b_C} ⊙ rowsum(h[c] ⊙ dh[c]) + Σ_t k_t ⊙ dk_t^{inter}
(`bwd_dqkg_kernel`; the last two terms are ⟨S_{c+1}, dh[c]⟩ per channel: everything after the chunk).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import new_empty
from ..common.tiles import (
    block,
    cast,
    device_fn,
    dot_precision,
    load_tile,
    load_tile_apart,
    mma,
    store_tile,
    tuned,
)
from ..common.tl_util import diag_span
from ..decay.chunk_h import chunk_bwd_dh, chunk_fwd_h
from ..decay.chunks import Varlen, chunk_local_cumsum, chunk_span

BC = 16
# The sm_90 notes at `common.tiles.CHUNK_CONFIGS` hold for every config here.
_CONFIGS = [
    triton.Config({}, num_warps=4, num_stages=2),
    # the 16-row sub-chunk tiles of the intra kernels leave 4 warps half idle
    triton.Config({}, num_warps=2, num_stages=2),
]
# dq/dk/dg: while Σ hᵀ ⊙ dhᵀ (the dg term) read the hᵀ and dhᵀ tiles that the dots take, Triton's
# pipeliner kept one shared buffer for each at 4 warps, 2 stages and refilled it while asynchronous
# wgmma dots still read it (a race bench/ttgir_checks.py flags), so the sum reads loads of its own
# (`load_tile_apart`). 8 warps, 2 stages compiles without spills for sm_90 at
# D = 128 (4 warps spills 56 bytes, 2 warps 1.9 KB).
_DQKG_CONFIGS = [triton.Config({}, num_warps=4, num_stages=2), triton.Config({}, num_warps=8, num_stages=2)]
_KEY = ["H", "HV", "K", "V", "BK", "BV"]
_O_DV_KEY = [*_KEY, "DV"]


@device_fn
def head_chunk(
    i_t, i_bh, cu_seqlens, chunk_idx, T,
    BT: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """(value head, its key head, chunk within the sequence, global chunk, sequence start, sequence
    length) of the program on chunk `i_t` of batch·value-head `i_bh`; HV / H value heads share a key head."""
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    _, i_c, i_tg, bos, T = chunk_span(i_t, i_b, cu_seqlens, chunk_idx, T, BT, IS_VARLEN)
    return i_hv, i_h, i_c, i_tg, bos, T


@device_fn
def dqk_state_terms(
    q, k, v, do, h, dh, bos, i_h, i_hv, i_tg, i_c, i_k, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DS: tl.constexpr,
    HDH: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Sums over the value blocks of chunk `i_c`, key block `i_k` of value head `i_hv` (v, do
    `[B, T, HV, V]` from the sequence start `bos`, h, dh `[NT, HV, K, V]` at global chunk `i_tg`):
    dO hᵀ and V dhᵀ `[BT, BK]`; with DS the scores dS = dO Vᵀ and dSᵀ `[BT, BT]` (each formed
    directly, zeros without); with HDH Σ_v hᵀ ⊙ dhᵀ `[BK]` from loads of its own
    (`load_tile_apart`: sharing the dots' tiles let the pipeliner race on their buffer). First in the
    result: q, k `[B, T, H, K]` moved to key head `i_h` of the sequence."""
    v += (bos * HV + i_hv) * V
    do += (bos * HV + i_hv) * V
    h += (i_tg * HV + i_hv) * K * V
    dh += (i_tg * HV + i_hv) * K * V
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_ds = tl.zeros([BT, BT], dtype=tl.float32)
    b_dsT = tl.zeros([BT, BT], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    n_v = tl.cdiv(V, BV)
    for i_v in range(n_v):
        b_v = load_tile(v, i_c * BT, i_v * BV, T, V, HV * V, 1, BT, BV)
        b_do = load_tile(do, i_c * BT, i_v * BV, T, V, HV * V, 1, BT, BV)
        if DS:
            b_vT = load_tile(v, i_v * BV, i_c * BT, V, T, 1, HV * V, BV, BT)
            b_doT = load_tile(do, i_v * BV, i_c * BT, V, T, 1, HV * V, BV, BT)
        # hᵀ, dhᵀ `[BV, BK]` loaded transposed from the `[K, V]` states
        b_hT = load_tile(h, i_v * BV, i_k * BK, V, K, 1, V, BV, BK)
        b_dhT = load_tile(dh, i_v * BV, i_k * BK, V, K, 1, V, BV, BK)
        if DS:
            b_ds += mma(b_do, b_vT, PREC)
            b_dsT += mma(b_v, b_doT, PREC)
        b_dq += mma(b_do, cast(b_hT, b_do.dtype), PREC)
        b_dk += mma(b_v, cast(b_dhT, b_v.dtype), PREC)
        if HDH:
            b_hT2 = load_tile_apart(h, i_v * BV, i_k * BK, V, K, 1, V, BV, BK)
            b_dhT2 = load_tile_apart(dh, i_v * BV, i_k * BK, V, K, 1, V, BV, BK)
            b_hdh += tl.sum(b_hT2.to(tl.float32) * b_dhT2.to(tl.float32), axis=0)
    q += (bos * H + i_h) * K
    k += (bos * H + i_h) * K
    return q, k, b_dq, b_dk, b_ds, b_dsT, b_hdh


@device_fn
def _sub_chunk_rows(
    q, k, g, A, bos, i_h, i_hv, r0,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """q, k (key head `i_h`), g `[B, T, HV, K]` and the scores A `[B, T, HV, BT]` (value head `i_hv`)
    moved to the sequence start `bos`, and the rows `[BC]` of the sub-chunk starting at row r0."""
    q += (bos * H + i_h) * K
    k += (bos * H + i_h) * K
    g += (bos * HV + i_hv) * K
    A += (bos * HV + i_hv) * BT
    return q, k, g, A, r0 + tl.arange(0, BC)


@tuned(_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def intra_A_kernel(
    q, k, g, A, cu_seqlens, chunk_idx, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr, SPAN: tl.constexpr,
):  # fmt: skip
    """Row block of query sub-chunk i_i: A[rows of i_i, 0:(i_i + 1)·BC] (`[BC, BC]` blocks)."""
    i_i, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hv, i_h, i_c, _, bos, T = head_chunk(i_t, i_bh, cu_seqlens, chunk_idx, T, BT, H, HV, IS_VARLEN)
    r0 = i_c * BT + i_i * BC
    if r0 >= T:
        return
    q, k, g, A, o_r = _sub_chunk_rows(q, k, g, A, bos, i_h, i_hv, r0, H, HV, K, BT, BC)
    o_k = tl.arange(0, BK)
    for j in range(0, i_i):
        b_A = tl.zeros([BC, BC], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            b_q = load_tile(q, r0, i_k * BK, T, K, H * K, 1, BC, BK)
            b_g = load_tile(g, r0, i_k * BK, T, K, HV * K, 1, BC, BK)
            b_gn = tl.load(g + r0 * HV * K + i_k * BK + o_k, mask=i_k * BK + o_k < K, other=0.0)
            b_kT = load_tile(k, i_k * BK, i_c * BT + j * BC, K, T, 1, H * K, BK, BC)
            b_gkT = load_tile(g, i_k * BK, i_c * BT + j * BC, K, T, 1, HV * K, BK, BC)
            # rows past T load g = 0: keep their exponent finite (they are never stored)
            expo = tl.where((o_r < T)[:, None], b_g - b_gn[None, :], 0.0)
            b_qg = cast(b_q * tl.exp(expo), b_q.dtype)
            b_kg = cast(b_kT * tl.exp(b_gn[:, None] - b_gkT), b_kT.dtype)
            b_A += mma(b_qg, b_kg, PREC)
        store_tile(A, b_A * scale, r0, j * BC, T, BT, HV * BT, 1, BC, BC)
    # diagonal block: A[r, c] = Σ q_r k_c e^{b_r − b_c} for c ≤ r
    b_A = tl.zeros([BC, BC], dtype=tl.float32)
    o_j = tl.arange(0, BC)
    r_last = tl.minimum(r0 + BC, T) - 1
    for i_k in range(tl.cdiv(K, BK)):
        m_k = i_k * BK + o_k < K
        b_q = load_tile(q, r0, i_k * BK, T, K, H * K, 1, BC, BK)
        b_g = load_tile(g, r0, i_k * BK, T, K, HV * K, 1, BC, BK)
        b_gn = tl.load(g + r0 * HV * K + i_k * BK + o_k, mask=m_k, other=0.0)
        b_gl = tl.load(g + r_last * HV * K + i_k * BK + o_k, mask=m_k, other=0.0)
        if tl.max(b_gn - b_gl, axis=0) <= SPAN:
            # the decay over this sub-chunk is moderate: one dot through the reference row r0,
            # (Q ⊙ e^{b − b_n})(K ⊙ e^{b_n − b})ᵀ, the second factor ≤ e^{SPAN}
            b_kT = load_tile(k, i_k * BK, r0, K, T, 1, H * K, BK, BC)
            b_gkT = load_tile(g, i_k * BK, r0, K, T, 1, HV * K, BK, BC)
            expo = tl.where((o_r < T)[:, None], b_g - b_gn[None, :], 0.0)
            b_qg = cast(b_q * tl.exp(expo), b_q.dtype)
            b_kg = cast(b_kT * tl.exp(b_gn[:, None] - b_gkT), b_kT.dtype)
            b_A += mma(b_qg, b_kg, PREC)
        else:
            # strong decay: elementwise with e^{b_r − b_c} ≤ 1, one column at a time
            b_qf = b_q.to(tl.float32)
            for jj in tl.static_range(BC):
                p = i_k * BK + o_k
                # the row test as a vector: the interpreter rejects a 0-d mask combined with a vector
                m = m_k & (p * 0 + r0 + jj < T)
                b_kj = tl.load(k + (r0 + jj) * H * K + p, mask=m, other=0.0).to(tl.float32)
                b_gj = tl.load(g + (r0 + jj) * HV * K + p, mask=m, other=0.0)
                expo = tl.where(((o_r >= r0 + jj) & (o_r < T))[:, None], b_g - b_gj[None, :], float("-inf"))
                col = tl.sum(b_qf * b_kj[None, :] * tl.exp(expo), axis=1)
                b_A += tl.where(o_j[None, :] == jj, col[:, None], 0.0)
    b_A = tl.where(o_r[:, None] >= (r0 + o_j)[None, :], b_A, 0.0)
    store_tile(A, b_A * scale, r0, i_i * BC, T, BT, HV * BT, 1, BC, BC)


@tuned(_CONFIGS, key=_O_DV_KEY)
@triton.jit(do_not_specialize=["T"])
def o_dv_kernel(
    a, c, g, s, A, out, cu_seqlens, chunk_idx, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr, DV: tl.constexpr,
):  # fmt: skip
    """The two products of form (A ⊙ decay) S[c] + (masked scores) C, a `[BT, BV]` tile of `out` a program.
    DV=False, the output: (a, c, s, out) = (q, v, h, o), o = s (Q ⊙ e^{b}) h[c] + A V.
    DV=True, dv: (a, c, s, out) = (k, do, dh, dv), dv = (K ⊙ e^{b_C − b}) dh[c] + Aᵀ dO (Aᵀ loaded
    transposed); scale is unused."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hv, i_h, i_c, i_tg, bos, T = head_chunk(i_t, i_bh, cu_seqlens, chunk_idx, T, BT, H, HV, IS_VARLEN)
    a += (bos * H + i_h) * K
    g += (bos * HV + i_hv) * K
    s += (i_tg * HV + i_hv) * K * V
    if DV:
        last = tl.minimum(i_c * BT + BT, T) - 1
        o_k = tl.arange(0, BK)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_a = load_tile(a, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK)
        b_g = load_tile(g, i_c * BT, i_k * BK, T, K, HV * K, 1, BT, BK)
        if DV:
            b_gl = tl.load(g + last * HV * K + i_k * BK + o_k, mask=i_k * BK + o_k < K, other=0.0)
        b_s = load_tile(s, i_k * BK, i_v * BV, K, V, V, 1, BK, BV)
        if DV:
            b_ad = cast(b_a * tl.exp(b_gl[None, :] - b_g), b_a.dtype)
        else:
            b_ad = cast(b_a * tl.exp(b_g) * scale, b_a.dtype)
        b_o += mma(b_ad, cast(b_s, b_a.dtype), PREC)
    o_t = i_c * BT + tl.arange(0, BT)
    if DV:
        # Aᵀ[j, r] = A[r, j]: rows j (the chunk column index), cols r (tokens)
        b_A = load_tile(A + (bos * HV + i_hv) * BT, 0, i_c * BT, BT, T, 1, HV * BT, BT, BT)
        m_A = (o_t[:, None] <= o_t[None, :]) & (o_t < T)[None, :]
    else:
        o_j = tl.arange(0, BT)
        m_A = (o_t[:, None] >= i_c * BT + o_j[None, :]) & (o_t < T)[:, None]
        b_A = load_tile(A + (bos * HV + i_hv) * BT, i_c * BT, 0, T, BT, HV * BT, 1, BT, BT)
    b_A = tl.where(m_A, b_A, 0.0)
    b_c = load_tile(c + (bos * HV + i_hv) * V, i_c * BT, i_v * BV, T, V, HV * V, 1, BT, BV)
    b_o += mma(cast(b_A, b_c.dtype), b_c, PREC)
    store_tile(out + (bos * HV + i_hv) * V, b_o, i_c * BT, i_v * BV, T, V, HV * V, 1, BT, BV)


@tuned(_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def bwd_dA_kernel(
    v, do, dA, cu_seqlens, chunk_idx, T,
    HV: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dA[r, j] = do_r·v_j for j ≤ r (zero above the diagonal), fp32."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_hv, _, i_c, _, bos, T = head_chunk(i_t, i_bh, cu_seqlens, chunk_idx, T, BT, H, HV, IS_VARLEN)
    v += (bos * HV + i_hv) * V
    do += (bos * HV + i_hv) * V
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do = load_tile(do, i_c * BT, i_v * BV, T, V, HV * V, 1, BT, BV)
        b_vT = load_tile(v, i_v * BV, i_c * BT, V, T, 1, HV * V, BV, BT)
        b_dA += mma(b_do, b_vT, PREC)
    o_t = i_c * BT + tl.arange(0, BT)
    b_dA = tl.where(o_t[:, None] >= o_t[None, :], b_dA, 0.0)
    store_tile(dA + (bos * HV + i_hv) * BT, b_dA, i_c * BT, 0, T, BT, HV * BT, 1, BT, BT)


@tuned(_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def bwd_dqk_intra_kernel(
    q, k, g, dA, dq, dk, cu_seqlens, chunk_idx, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr, SPAN: tl.constexpr,
):  # fmt: skip
    """Intra-chunk dq, dk `[B, T, HV, K]` (fp32) of sub-chunk i_i and K block i_k."""
    i_ki, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NC: tl.constexpr = BT // BC
    i_k, i_i = i_ki // NC, i_ki % NC
    i_hv, i_h, i_c, _, bos, T = head_chunk(i_t, i_bh, cu_seqlens, chunk_idx, T, BT, H, HV, IS_VARLEN)
    r0 = i_c * BT + i_i * BC
    if r0 >= T:
        return
    q, k, g, dA, o_r = _sub_chunk_rows(q, k, g, dA, bos, i_h, i_hv, r0, H, HV, K, BT, BC)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    b_g = load_tile(g, r0, i_k * BK, T, K, HV * K, 1, BC, BK)

    # dq_r = Σ_{j ≤ r} dA[r, j] k_j ⊙ e^{b_r − b_j}; earlier sub-chunks through the reference row r0
    b_dq = tl.zeros([BC, BK], dtype=tl.float32)
    b_gn = tl.load(g + r0 * HV * K + o_k, mask=m_k, other=0.0)
    r_last = tl.minimum(r0 + BC, T) - 1
    b_gm = tl.load(g + r_last * HV * K + o_k, mask=m_k, other=0.0)
    # moderate decay over this sub-chunk: its diagonal block is a dot too (see intra_A_kernel)
    fast = tl.max(b_gn - b_gm, axis=0) <= SPAN
    for j in range(0, i_i):
        b_k = load_tile(k, i_c * BT + j * BC, i_k * BK, T, K, H * K, 1, BC, BK)
        b_gk = load_tile(g, i_c * BT + j * BC, i_k * BK, T, K, HV * K, 1, BC, BK)
        b_dAij = load_tile(dA, r0, j * BC, T, BT, HV * BT, 1, BC, BC)
        b_kg = cast(b_k * tl.exp(b_gn[None, :] - b_gk), b_k.dtype)
        b_dq += mma(cast(b_dAij, b_k.dtype), b_kg, PREC)
    if fast:
        b_k = load_tile(k, r0, i_k * BK, T, K, H * K, 1, BC, BK)
        # dA is zero above the diagonal (bwd_dA_kernel), so the block needs no mask
        b_dAii = load_tile(dA, r0, i_i * BC, T, BT, HV * BT, 1, BC, BC)
        b_kg = cast(b_k * tl.exp(b_gn[None, :] - b_g), b_k.dtype)
        b_dq += mma(cast(b_dAii, b_k.dtype), b_kg, PREC)
    b_dq *= tl.exp(tl.where((o_r < T)[:, None], b_g - b_gn[None, :], 0.0))
    if not fast:
        for jj in tl.static_range(BC):
            m = m_k & (o_k * 0 + r0 + jj < T)
            b_kj = tl.load(k + (r0 + jj) * H * K + o_k, mask=m, other=0.0).to(tl.float32)
            b_gj = tl.load(g + (r0 + jj) * HV * K + o_k, mask=m, other=0.0)
            b_dAj = tl.load(dA + o_r * HV * BT + i_i * BC + jj, mask=o_r < T, other=0.0)
            expo = tl.where(((o_r >= r0 + jj) & (o_r < T))[:, None], b_g - b_gj[None, :], float("-inf"))
            b_dq += b_dAj[:, None] * b_kj[None, :] * tl.exp(expo)

    # dk_c = Σ_{r ≥ c} dA[r, c] q_r ⊙ e^{b_r − b_c}; later sub-chunks through the last row of this one
    b_dk = tl.zeros([BC, BK], dtype=tl.float32)
    for j in range(i_i + 1, NC):
        s0 = i_c * BT + j * BC
        b_q = load_tile(q, s0, i_k * BK, T, K, H * K, 1, BC, BK)
        b_gq = load_tile(g, s0, i_k * BK, T, K, HV * K, 1, BC, BK)
        # dA_jiᵀ `[BC (this sub-chunk), BC (sub-chunk j)]`, loaded transposed
        b_dAT = load_tile(dA, i_i * BC, s0, BT, T, 1, HV * BT, BC, BC)
        # rows past T load g = 0, so their exponent could be positive: zero them before the exp
        m_q = (s0 + tl.arange(0, BC) < T)[:, None]
        b_qg = cast(b_q * tl.exp(tl.where(m_q, b_gq - b_gm[None, :], float("-inf"))), b_q.dtype)
        b_dk += mma(cast(b_dAT, b_q.dtype), b_qg, PREC)
    if fast:
        b_q = load_tile(q, r0, i_k * BK, T, K, H * K, 1, BC, BK)
        b_dAT = load_tile(dA, i_i * BC, r0, BT, T, 1, HV * BT, BC, BC)
        # e^{b_r − b_m} ≥ 1 up to e^{SPAN}; rows past T load g = 0: exponent 0 there
        b_qg = cast(b_q * tl.exp(tl.where((o_r < T)[:, None], b_g - b_gm[None, :], 0.0)), b_q.dtype)
        b_dk += mma(cast(b_dAT, b_q.dtype), b_qg, PREC)
    b_dk *= tl.where((o_r < T)[:, None], tl.exp(b_gm[None, :] - b_g), 0.0)
    if not fast:
        o_j = i_i * BC + tl.arange(0, BC)
        for jj in tl.static_range(BC):
            m = m_k & (o_k * 0 + r0 + jj < T)
            b_qj = tl.load(q + (r0 + jj) * H * K + o_k, mask=m, other=0.0).to(tl.float32)
            b_gj = tl.load(g + (r0 + jj) * HV * K + o_k, mask=m, other=0.0)
            b_dAj = tl.load(dA + (r0 + jj) * HV * BT + o_j, mask=o_j * 0 + r0 + jj < T, other=0.0)
            m_e = (o_r <= r0 + jj) & (o_r * 0 + r0 + jj < T)
            expo = tl.where(m_e[:, None], b_gj[None, :] - b_g, float("-inf"))
            b_dk += b_dAj[:, None] * b_qj[None, :] * tl.exp(expo)

    dq += (bos * HV + i_hv) * K
    dk += (bos * HV + i_hv) * K
    store_tile(dq, b_dq * scale, r0, i_k * BK, T, K, HV * K, 1, BC, BK)
    store_tile(dk, b_dk * scale, r0, i_k * BK, T, K, HV * K, 1, BC, BK)


@tuned(_DQKG_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def bwd_dqkg_kernel(
    q, k, v, g, h, do, dh, dq_in, dk_in, dq, dk, dg, cu_seqlens, chunk_idx, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """State terms of dq, dk added to the intra-chunk ones, and dg `[B, T, HV, K]` (fp32)."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hv, i_h, i_c, i_tg, bos, T = head_chunk(i_t, i_bh, cu_seqlens, chunk_idx, T, BT, H, HV, IS_VARLEN)
    q, k, b_dq, b_dk, _, _, b_hdh = dqk_state_terms(
        q, k, v, do, h, dh, bos, i_h, i_hv, i_tg, i_c, i_k, T, H, HV, K, V, BT, BK, BV, False, True, PREC
    )
    g += (bos * HV + i_hv) * K
    o_k = i_k * BK + tl.arange(0, BK)
    o_t = i_c * BT + tl.arange(0, BT)
    last = tl.minimum(i_c * BT + BT, T) - 1
    b_q = load_tile(q, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK).to(tl.float32)
    b_k = load_tile(k, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK).to(tl.float32)
    b_g = load_tile(g, i_c * BT, i_k * BK, T, K, HV * K, 1, BT, BK)
    b_gl = tl.load(g + last * HV * K + o_k, mask=o_k < K, other=0.0)
    b_dq = b_dq * tl.exp(b_g) * scale
    b_dk_inter = b_dk * tl.where((o_t < T)[:, None], tl.exp(b_gl[None, :] - b_g), 0.0)
    off = (bos * HV + i_hv) * K
    b_dq += load_tile(dq_in + off, i_c * BT, i_k * BK, T, K, HV * K, 1, BT, BK)
    b_dk = b_dk_inter + load_tile(dk_in + off, i_c * BT, i_k * BK, T, K, HV * K, 1, BT, BK)
    b_dF = b_q * b_dq - b_k * b_dk
    # everything after this chunk: ⟨S_{c+1}, dh[c]⟩ per channel
    b_z = tl.exp(b_gl) * b_hdh + tl.sum(b_k * b_dk_inter, axis=0)
    # reverse cumulative sum inside the chunk: Σ_{t ≥ r} dF_t
    b_dg = tl.sum(b_dF, axis=0)[None, :] - tl.cumsum(b_dF, axis=0) + b_dF + b_z[None, :]
    store_tile(dq + off, b_dq, i_c * BT, i_k * BK, T, K, HV * K, 1, BT, BK)
    store_tile(dk + off, b_dk, i_c * BT, i_k * BK, T, K, HV * K, 1, BT, BK)
    store_tile(dg + off, b_dg, i_c * BT, i_k * BK, T, K, HV * K, 1, BT, BK)


def _meta(q, v, vl):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    return dict(H=H, HV=HV, K=K, V=V, BT=vl.chunk, BK=block(K), BV=block(V), IS_VARLEN=vl.is_varlen,
                PREC=dot_precision(q.dtype))  # fmt: skip


def _intra_A(q, k, v, g_cum, scale, vl):
    """Intra-chunk scores A `[B, T, HV, BT]` (fp32, lower triangle of each chunk valid)."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    A = new_empty(q, B, T, HV, vl.chunk, dtype=torch.float32)
    meta = _meta(q, v, vl)
    grid = (vl.chunk // BC, vl.NT, vl.grid_rows(B) * HV)
    span = diag_span(q.dtype == torch.float16)
    intra_A_kernel[grid](q, k, g_cum, A, vl.cu, vl.idx, scale, T, BC=BC, SPAN=span, **meta)
    return A


def chunk_gla_fwd(q, k, v, g, scale, h0, cu_seqlens, store_final):
    """Forward: o `[B, T, HV, V]` (dtype of v), the final state `[N, HV, K, V]` fp32 (or None) and
    the intra-chunk scores A `[B, T, HV, BT]` (fp32), which the backward reuses."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    vl = Varlen(cu_seqlens, B, T)
    g_cum = chunk_local_cumsum(g, vl)
    h, ht = chunk_fwd_h(k, v, g_cum, h0, vl, store_final)
    A = _intra_A(q, k, v, g_cum, scale, vl)
    o = new_empty(v, *v.shape)
    meta = _meta(q, v, vl)
    grid = (triton.cdiv(V, meta["BV"]), vl.NT, vl.grid_rows(B) * HV)
    o_dv_kernel[grid](q, v, g_cum, h, A, o, vl.cu, vl.idx, scale, T, DV=False, **meta)
    return o, ht, A


def chunk_gla_bwd(q, k, v, g, A, scale, h0, do, dht, cu_seqlens):
    """Backward from the forward's A: (dq, dk, dv, dg, dh0); dh0 is None without h0."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    vl = Varlen(cu_seqlens, B, T)
    meta = _meta(q, v, vl)
    rows = vl.grid_rows(B) * HV
    g_cum = chunk_local_cumsum(g, vl)
    h, _ = chunk_fwd_h(k, v, g_cum, h0, vl, store_final=False)
    dh, dh0 = chunk_bwd_dh(q, do, g_cum, dht, vl, scale, want_dh0=h0 is not None)
    dA = new_empty(q, B, T, HV, vl.chunk, dtype=torch.float32)
    bwd_dA_kernel[(vl.NT, rows)](v, do, dA, vl.cu, vl.idx, T, **meta)
    dv = new_empty(v, *v.shape)
    o_dv_kernel[(triton.cdiv(V, meta["BV"]), vl.NT, rows)](
        k, do, g_cum, dh, A, dv, vl.cu, vl.idx, scale, T, DV=True, **meta
    )
    NK = triton.cdiv(K, meta["BK"])
    dq_in = new_empty(q, B, T, HV, K, dtype=torch.float32)
    dk_in = new_empty(q, B, T, HV, K, dtype=torch.float32)
    grid = (NK * (vl.chunk // BC), vl.NT, rows)
    span = diag_span(q.dtype == torch.float16)
    args = (q, k, g_cum, dA, dq_in, dk_in, vl.cu, vl.idx, scale, T)
    bwd_dqk_intra_kernel[grid](*args, BC=BC, SPAN=span, **meta)
    # per value head; summed over each GVA group below
    dq = new_empty(q, B, T, HV, K, dtype=q.dtype if HV == H else torch.float32)
    dk = new_empty(q, B, T, HV, K, dtype=q.dtype if HV == H else torch.float32)
    dg = new_empty(q, B, T, HV, K, dtype=torch.float32)
    bwd_dqkg_kernel[(NK, vl.NT, rows)](
        q, k, v, g_cum, h, do, dh, dq_in, dk_in, dq, dk, dg, vl.cu, vl.idx, scale, T, **meta
    )
    if HV != H:
        dq = dq.view(B, T, H, HV // H, K).sum(3).to(q.dtype)
        dk = dk.view(B, T, H, HV // H, K).sum(3).to(k.dtype)
    return dq, dk, dv, dg, dh0
