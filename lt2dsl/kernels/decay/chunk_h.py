"""Chunk-boundary states of decayed linear attention (phase 2 of mixers.md §0's chunked kernels).

Forward: h[c] = state *entering* chunk c, S ← Diag(e^{b_C}) S + (K ⊙ e^{b_C − b})ᵀ V per chunk.
Backward: dh[c] = gradient w.r.t. the state *leaving* chunk c (dh of the last chunk is dht),
dS ← Diag(e^{b_C}) dS + (s Q ⊙ e^{b})ᵀ dO. b is the chunk-local cumulative log decay: none
(G_MODE 0), one scalar per token and head (1, `[B, T, HV]`), or per channel (2, `[B, T, HV, K]`).
Every exponent is ≤ 0. One program owns a `[BK, BV]` tile of one (sequence, value head) and walks
its chunks in order; the state stays in fp32 registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import new_empty
from ..common.tiles import block, cast, device_fn, dot_precision, load_tile, load_vec, mma, store_tile, tuned
from ..common.tl_util import head_split
from .chunks import Varlen, seq_span

# Hopper (sm_90, Triton 3.6) notes, every config: no tl.trans of any value (transposed operands are
# loaded transposed), so the accumulator-transpose miscompile of Triton 3.4–3.7.0 cannot hit; tiles
# are powers of two ≥ 16. A head dim that is not a multiple of the tile is a masked pointer load;
# the README's sm_90 crash for odd head dims in 16-bit backward kernels is not ruled out (the GPU
# tests use 64 and 128). num_warps=4 failed on sm_90 in the peer's delta-rule WY backward (a
# triangular solve), a pattern absent here. Every config is checked on the H200 by
# `test_gpu_every_autotune_config` (force_config).
_STATE_CONFIGS = [
    triton.Config({}, num_warps=4, num_stages=2),
    triton.Config({}, num_warps=2, num_stages=3),
]


@device_fn
def chunk_gate(
    g, bos, i_hv, i_t, i_k, o_k, T,
    HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, G_MODE: tl.constexpr,
):  # fmt: skip
    """Log decays of chunk i_t of the sequence starting at token bos, value head i_hv: (at the
    chunk's last token, at each of its tokens); a scalar and `[BT]` for a per-head gate (G_MODE 1),
    `[BK]` and `[BK, BT]` (key channels o_k = i_k * BK + arange(BK), transposed) for a per-channel
    one (G_MODE 2)."""
    last = tl.minimum((i_t + 1) * BT, T) - 1
    if G_MODE == 1:
        p_g = g + bos * HV + i_hv
        b_glast = tl.load(p_g + last * HV)
        b_g = load_vec(p_g, i_t * BT, T, HV, BT)
    else:
        p_g = g + (bos * HV + i_hv) * K
        b_glast = tl.load(p_g + last * HV * K + o_k, mask=o_k < K, other=0.0)
        b_g = load_tile(p_g, i_k * BK, i_t * BT, K, T, 1, HV * K, BK, BT)
    return b_glast, b_g


@device_fn
def load_state(p, i_k, i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Tile (i_k, i_v) `[BK, BV]` of the `[K, V]` state at p, in fp32."""
    return load_tile(p, i_k * BK, i_v * BV, K, V, V, 1, BK, BV).to(tl.float32)


@device_fn
def store_state(p, x, i_k, i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Store x `[BK, BV]` as tile (i_k, i_v) of the `[K, V]` state at p."""
    store_tile(p, x, i_k * BK, i_v * BV, K, V, V, 1, BK, BV)


@device_fn
def initial_state(
    h0, i_nh, i_k, i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_H0: tl.constexpr,
):  # fmt: skip
    """fp32 `[BK, BV]`: tile (i_k, i_v) of state i_nh of h0 `[N, HV, K, V]` with HAS_H0, else zeros."""
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        b_h += load_state(h0 + i_nh.to(tl.int64) * K * V, i_k, i_v, K, V, BK, BV)
    return b_h


@device_fn
def state_program(
    qk, v, h0, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, HAS_H0: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """(i_k, i_v, i_nh, value head, first token, length, first chunk, qk and v at the sequence's first
    token and their heads, key channels o_k, the `initial_state` tile from h0) of the program that
    owns state tile (i_k, i_v) of (sequence, value head) i_nh = sequence * HV + value head; qk is
    `[B, T, H, K]`, v `[B, T, HV, V]`."""
    i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n, i_hv, i_h = head_split(i_nh, H, HV)
    bos, T, boc = seq_span(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    qk += (bos * H + i_h) * K
    v += (bos * HV + i_hv) * V
    o_k = i_k * BK + tl.arange(0, BK)
    b_h = initial_state(h0, i_nh, i_k, i_v, K, V, BK, BV, HAS_H0)
    return i_k, i_v, i_nh, i_hv, bos, T, boc, qk, v, o_k, b_h


@device_fn
def chunk_tiles(
    h, b_h, qk, v, i_t, boc, i_hv, i_k, i_v, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr,
):  # fmt: skip
    """Store b_h as chunk i_t's entry of h `[n_chunks, HV, K, V]` and return the chunk's qkᵀ tile
    `[BK, BT]` (loaded transposed) and v tile `[BT, BV]` (qk, v at the sequence's first token)."""
    p_h = h + ((boc + i_t) * HV + i_hv) * K * V
    store_state(p_h, b_h, i_k, i_v, K, V, BK, BV)
    b_kT = load_tile(qk, i_k * BK, i_t * BT, K, T, 1, H * K, BK, BT)
    b_v = load_tile(v, i_t * BT, i_v * BV, T, V, HV * V, 1, BT, BV)
    return b_kT, b_v


@tuned(_STATE_CONFIGS, key=["H", "HV", "K", "V", "BK", "BV", "G_MODE"])
@triton.jit(do_not_specialize=["T"])
def chunk_fwd_h_kernel(
    k, v, g, h, h0, ht, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, G_MODE: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """h `[n_chunks, HV, K, V]`: tile (i_k, i_v) of the state entering each chunk of one (sequence,
    value head), from h0 (HAS_H0) or zeros; with STORE_HT the state after the last chunk in ht."""
    i_k, i_v, i_nh, i_hv, bos, T, boc, k, v, o_k, b_h = state_program(
        k, v, h0, cu_seqlens, chunk_offsets, T, H, HV, K, V, BT, BK, BV, HAS_H0, IS_VARLEN
    )
    for i_t in range(tl.cdiv(T, BT)):
        b_kT, b_v = chunk_tiles(h, b_h, k, v, i_t, boc, i_hv, i_k, i_v, T, H, HV, K, V, BT, BK, BV)
        if G_MODE > 0:
            b_glast, b_g = chunk_gate(g, bos, i_hv, i_t, i_k, o_k, T, HV, K, BT, BK, G_MODE)
        if G_MODE == 1:
            b_h *= tl.exp(b_glast)
            b_v = cast(b_v * tl.exp(b_glast - b_g)[:, None], b_v.dtype)
        if G_MODE == 2:
            b_h *= tl.exp(b_glast)[:, None]
            b_kT = cast(b_kT * tl.exp(b_glast[:, None] - b_g), b_kT.dtype)
        b_h += mma(b_kT, b_v, PREC)
    if STORE_HT:
        store_state(ht + i_nh.to(tl.int64) * K * V, b_h, i_k, i_v, K, V, BK, BV)


@tuned(_STATE_CONFIGS, key=["H", "HV", "K", "V", "BK", "BV", "G_MODE"])
@triton.jit(do_not_specialize=["T"])
def chunk_bwd_dh_kernel(
    q, g, do, dh, dht, dh0, cu_seqlens, chunk_offsets, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, G_MODE: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
    IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dh `[n_chunks, HV, K, V]`: tile (i_k, i_v) of the gradient w.r.t. the state leaving each chunk
    of one (sequence, value head), walked from the last chunk back (from dht with HAS_DHT, else
    zeros); with STORE_DH0 the gradient w.r.t. the initial state in dh0."""
    i_k, i_v, i_nh, i_hv, bos, T, boc, q, do, o_k, b_dh = state_program(
        q, do, dht, cu_seqlens, chunk_offsets, T, H, HV, K, V, BT, BK, BV, HAS_DHT, IS_VARLEN
    )
    for i_t in range(tl.cdiv(T, BT) - 1, -1, -1):
        b_qT, b_do = chunk_tiles(dh, b_dh, q, do, i_t, boc, i_hv, i_k, i_v, T, H, HV, K, V, BT, BK, BV)
        if G_MODE == 0:
            # fp32 before scaling: a 16-bit tile times a scalar stays 16-bit (and the interpreter
            # gets bf16 arithmetic wrong)
            b_qT = cast(b_qT.to(tl.float32) * scale, b_qT.dtype)
        if G_MODE > 0:
            b_glast, b_g = chunk_gate(g, bos, i_hv, i_t, i_k, o_k, T, HV, K, BT, BK, G_MODE)
        if G_MODE == 1:
            b_qT = cast(b_qT * (tl.exp(b_g) * scale)[None, :], b_qT.dtype)
            b_dh *= tl.exp(b_glast)
        if G_MODE == 2:
            b_qT = cast(b_qT * tl.exp(b_g) * scale, b_qT.dtype)
            b_dh *= tl.exp(b_glast)[:, None]
        b_dh += mma(b_qT, cast(b_do, b_qT.dtype), PREC)
    if STORE_DH0:
        store_state(dh0 + i_nh.to(tl.int64) * K * V, b_dh, i_k, i_v, K, V, BK, BV)


def _g_mode(g: torch.Tensor | None) -> int:
    return 0 if g is None else (1 if g.dim() == 3 else 2)


def _state_launch(qk: torch.Tensor, v: torch.Tensor, g_cum: torch.Tensor | None, vl: Varlen, want_last: bool):
    """What a state kernel's launch needs besides its tensors: the per-chunk state buffer
    `[n_chunks, HV, K, V]` (qk's dtype), the fp32 `[N, HV, K, V]` one when `want_last` (else None),
    the grid over (K tile, V tile, sequence x value head), T and the shared constexpr keywords; qk is
    `[B, T, H, K]`, v `[B, T, HV, V]`."""
    B, T, H, K = qk.shape
    HV, V = v.shape[2], v.shape[3]
    states = new_empty(qk, vl.n_chunks, HV, K, V)
    last = new_empty(qk, vl.N, HV, K, V, dtype=torch.float32) if want_last else None
    BK, BV = block(K), block(V)
    grid = (triton.cdiv(K, BK), triton.cdiv(V, BV), vl.N * HV)
    meta = dict(H=H, HV=HV, K=K, V=V, BT=vl.chunk, BK=BK, BV=BV, G_MODE=_g_mode(g_cum),
                IS_VARLEN=vl.is_varlen, PREC=dot_precision(qk.dtype))  # fmt: skip
    return states, last, grid, T, meta


def chunk_fwd_h(
    k: torch.Tensor, v: torch.Tensor, g_cum: torch.Tensor | None, h0: torch.Tensor | None, vl: Varlen,
    store_final: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """States entering every chunk.

    Args:
        k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, HV, V]`.
        g_cum (torch.Tensor, Optional): chunk-local cumulative log decay, fp32 `[B, T, HV]`
            or `[B, T, HV, K]`.
        h0 (torch.Tensor, Optional): `[N, HV, K, V]`.
        vl (Varlen): chunk bookkeeping.
        store_final (bool): also return the final state.

    Returns:
        h (torch.Tensor): `[n_chunks, HV, K, V]` in k's dtype (fp32 for fp32 inputs).
        ht (torch.Tensor or None): `[N, HV, K, V]` fp32.
    """
    h, ht, grid, T, meta = _state_launch(k, v, g_cum, vl, store_final)
    chunk_fwd_h_kernel[grid](
        k, v, g_cum, h, h0, ht, vl.cu, vl.offsets, T, HAS_H0=h0 is not None, STORE_HT=store_final, **meta
    )
    return h, ht


def chunk_bwd_dh(
    q: torch.Tensor, do: torch.Tensor, g_cum: torch.Tensor | None, dht: torch.Tensor | None, vl: Varlen,
    scale: float, want_dh0: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Gradients w.r.t. the state leaving every chunk (`[n_chunks, HV, K, V]`) and w.r.t. h0 (fp32)."""
    dh, dh0, grid, T, meta = _state_launch(q, do, g_cum, vl, want_dh0)
    chunk_bwd_dh_kernel[grid](
        q, g_cum, do, dh, dht, dh0, vl.cu, vl.offsets, scale, T, HAS_DHT=dht is not None, STORE_DH0=want_dh0,
        **meta,
    )  # fmt: skip
    return dh, dh0
