"""Triton chunked forward and backward of scalar-decay linear attention (`simple_gla`).

Chunk size BT = 64; b is the chunk-local cumulative log decay `[B, T, HV]` (fp32).
Forward: o = s (Q ⊙ e^{b}) h[c] + s ((Q Kᵀ) ⊙ Γ) V with Γ_{ri} = e^{b_r − b_i} (i ≤ r).
Backward (g the per-token log decay, F its global cumulative sum; mixers.md §2):
* dv_i = Σ_{r≥i} s Γ_{ri} (q_r·k_i) do_r + e^{b_C − b_i} dh[c]ᵀ k_i
* dq_r = s e^{b_r} h[c] do_r + s Σ_{i≤r} Γ_{ri} (do_r·v_i) k_i
* dk_i = e^{b_C − b_i} dh[c] v_i + s Σ_{r≥i} Γ_{ri} (do_r·v_i) q_r
* ∂L/∂F_t = q_t·dq_t − k_t·dk_t, and d g_l = Σ_{t≥l} ∂L/∂F_t. The part from later chunks equals
  ⟨S_{c+1}, dh[c]⟩ = e^{b_C} ⟨h[c], dh[c]⟩ + Σ_i k_i·dk_i^{inter} (scaling the state leaving chunk c
  is the same as shifting every later F), so dg needs no sequence-long reverse scan.
Transposed products (Aᵀ, dSᵀ) are computed directly with swapped, transposed-loaded operands.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import new_empty
from ..common.chunk_dots import state_and_scores
from ..common.tiles import (
    CHUNK_CONFIGS,
    block,
    cast,
    device_fn,
    dot_precision,
    load_tile,
    load_vec,
    mma,
    store_tile,
    store_vec,
    tuned,
)
from ..decay.chunk_h import chunk_bwd_dh, chunk_fwd_h
from ..decay.chunks import Varlen, chunk_local_cumsum
from ..gla.chunk import dqk_state_terms, head_chunk

_CONFIGS = CHUNK_CONFIGS  # sm_90 notes at `CHUNK_CONFIGS`
_KEY = ["H", "HV", "K", "V", "BK", "BV", "HAS_G"]
# dq/dk/dg: the dg term Σ hᵀ ⊙ dhᵀ reads loads of its own (`load_tile_apart`). Read from the hᵀ
# and dhᵀ tiles the dots take, Triton's pipeliner keeps one shared buffer for each at 2 stages and
# prefetches into it while asynchronous wgmma dots still read it (a race the sm_90 TTGIR check,
# bench/ttgir_checks.py, flags); apart, every config double-buffers the dot operands.
_DQKG_CONFIGS = _CONFIGS


@device_fn
def _decay_mask(b_g, i_c, T, BT: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Γ `[BT, BT]`: e^{b_r − b_i} for i ≤ r < T (rows r, cols i), or its transpose; 0 elsewhere."""
    o_t = i_c * BT + tl.arange(0, BT)
    valid = o_t < T
    if TRANSPOSED:
        m = (o_t[:, None] <= o_t[None, :]) & valid[:, None] & valid[None, :]
        expo = tl.where(m, b_g[None, :] - b_g[:, None], float("-inf"))
    else:
        m = (o_t[:, None] >= o_t[None, :]) & valid[:, None] & valid[None, :]
        expo = tl.where(m, b_g[:, None] - b_g[None, :], float("-inf"))
    return tl.exp(expo)


@device_fn
def _causal_mask(i_c, T, BT: tl.constexpr, TRANSPOSED: tl.constexpr):
    o_t = i_c * BT + tl.arange(0, BT)
    valid = o_t < T
    if TRANSPOSED:
        m = (o_t[:, None] <= o_t[None, :]) & valid[:, None] & valid[None, :]
    else:
        m = (o_t[:, None] >= o_t[None, :]) & valid[:, None] & valid[None, :]
    return tl.where(m, 1.0, 0.0)


@tuned(_CONFIGS, key=[*_KEY, "DV"])
@triton.jit(do_not_specialize=["T"])
def o_dv_kernel(
    a, b, c, g, s, out, cu_seqlens, chunk_idx, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr, DV: tl.constexpr,
):  # fmt: skip
    """The two products of form A S[c] + (A Bᵀ ⊙ mask) C, a `[BT, BV]` tile of `out` a program.
    DV=False, the output: (a, b, c, s, out) = (q, k, v, h, o), o = s (Q ⊙ e^{b}) h[c] + s (Q Kᵀ ⊙ Γ) V.
    DV=True, dv: (a, b, c, s, out) = (k, q, do, dh, dv), dv = (K ⊙ e^{b_C − b}) dh[c] + s (K Qᵀ ⊙ Γᵀ) dO.
    A Bᵀ is formed directly (`state_and_scores`)."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hv, i_h, i_c, i_tg, bos, T = head_chunk(i_t, i_bh, cu_seqlens, chunk_idx, T, BT, H, HV, IS_VARLEN)
    if DV:  # q (here b) is moved before k in both forms: the order each form was tuned with
        b += (bos * H + i_h) * K
        a += (bos * H + i_h) * K
    else:
        a += (bos * H + i_h) * K
        b += (bos * H + i_h) * K
    s += (i_tg * HV + i_hv) * K * V
    b_o, b_A = state_and_scores(a, b, s, i_c, i_v, T, H, K, V, BT, BK, BV, PREC, DV)
    if HAS_G:
        b_g = load_vec(g + bos * HV + i_hv, i_c * BT, T, HV, BT)
        if DV:
            b_glast = tl.load(g + (bos + tl.minimum(i_c * BT + BT, T) - 1) * HV + i_hv)
            o_t = i_c * BT + tl.arange(0, BT)
            b_o *= tl.where(o_t < T, tl.exp(b_glast - b_g), 0.0)[:, None]
        else:
            b_o *= tl.exp(b_g)[:, None]
        b_A *= _decay_mask(b_g, i_c, T, BT, DV)
    else:
        b_A *= _causal_mask(i_c, T, BT, DV)
    b_c = load_tile(c + (bos * HV + i_hv) * V, i_c * BT, i_v * BV, T, V, HV * V, 1, BT, BV)
    if DV:
        b_o += mma(cast(b_A * scale, b_c.dtype), b_c, PREC)
    else:
        b_o += mma(cast(b_A, b_c.dtype), b_c, PREC)
        b_o = b_o * scale
    store_tile(out + (bos * HV + i_hv) * V, b_o, i_c * BT, i_v * BV, T, V, HV * V, 1, BT, BV)


@tuned(_DQKG_CONFIGS, key=_KEY)
@triton.jit(do_not_specialize=["T"])
def bwd_dqkg_kernel(
    q, k, v, g, h, do, dh, dq, dk, dg, cu_seqlens, chunk_idx, scale, T, BTOT,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hv, i_h, i_c, i_tg, bos, T = head_chunk(i_t, i_bh, cu_seqlens, chunk_idx, T, BT, H, HV, IS_VARLEN)
    q, k, b_dq, b_dk, b_ds, b_dsT, b_hdh = dqk_state_terms(
        q, k, v, do, h, dh, bos, i_h, i_hv, i_tg, i_c, i_k, T, H, HV, K, V, BT, BK, BV, True, HAS_G, PREC
    )
    b_q = load_tile(q, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK)
    b_k = load_tile(k, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK)
    o_t = i_c * BT + tl.arange(0, BT)
    if HAS_G:
        p_g = g + bos * HV + i_hv
        b_g = load_vec(p_g, i_c * BT, T, HV, BT)
        b_glast = tl.load(p_g + (tl.minimum(i_c * BT + BT, T) - 1) * HV)
        b_dq *= (tl.exp(b_g) * scale)[:, None]
        b_dk *= tl.where(o_t < T, tl.exp(b_glast - b_g), 0.0)[:, None]
        b_ds *= _decay_mask(b_g, i_c, T, BT, False) * scale
        b_dsT *= _decay_mask(b_g, i_c, T, BT, True) * scale
    else:
        b_dq *= scale
        b_ds *= _causal_mask(i_c, T, BT, False) * scale
        b_dsT *= _causal_mask(i_c, T, BT, True) * scale
    b_dk_inter = b_dk
    b_dq = b_dq + mma(cast(b_ds, b_k.dtype), b_k, PREC)
    b_dk = b_dk_inter + mma(cast(b_dsT, b_q.dtype), b_q, PREC)
    dq += (bos * HV + i_hv) * K
    dk += (bos * HV + i_hv) * K
    store_tile(dq, b_dq, i_c * BT, i_k * BK, T, K, HV * K, 1, BT, BK)
    store_tile(dk, b_dk, i_c * BT, i_k * BK, T, K, HV * K, 1, BT, BK)
    if HAS_G:
        b_dF = tl.sum(b_q.to(tl.float32) * b_dq, axis=1) - tl.sum(b_k.to(tl.float32) * b_dk, axis=1)
        # everything after this chunk: ⟨S_{c+1}, dh[c]⟩ restricted to this K block
        b_z = tl.exp(b_glast) * tl.sum(b_hdh) + tl.sum(b_k.to(tl.float32) * b_dk_inter)
        # reverse cumulative sum inside the chunk: Σ_{t ≥ r} dF_t
        b_dg = tl.sum(b_dF) - tl.cumsum(b_dF, axis=0) + b_dF + b_z
        store_vec(dg + i_k.to(tl.int64) * BTOT * HV + bos * HV + i_hv, b_dg, i_c * BT, T, HV, BT)


def chunk_simple_gla_fwd(q, k, v, g, scale, h0, cu_seqlens, store_final):
    """Forward: o `[B, T, HV, V]` (dtype of v) and the final state `[N, HV, K, V]` fp32 (or None)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    vl = Varlen(cu_seqlens, B, T)
    g_cum = None if g is None else chunk_local_cumsum(g, vl)
    h, ht = chunk_fwd_h(k, v, g_cum, h0, vl, store_final)
    o = new_empty(v, *v.shape)
    BK, BV = block(K), block(V)
    grid = (triton.cdiv(V, BV), vl.NT, vl.grid_rows(B) * HV)
    o_dv_kernel[grid](
        q, k, v, g_cum, h, o, vl.cu, vl.idx, scale, T,
        H=H, HV=HV, K=K, V=V, BT=vl.chunk, BK=BK, BV=BV,
        HAS_G=g is not None, IS_VARLEN=vl.is_varlen, PREC=dot_precision(q.dtype), DV=False,
    )  # fmt: skip
    return o, ht


def chunk_simple_gla_bwd(q, k, v, g, scale, h0, do, dht, cu_seqlens):
    """Backward: (dq, dk, dv, dg, dh0); dg is None when g is None, dh0 None without h0."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    vl = Varlen(cu_seqlens, B, T)
    g_cum = None if g is None else chunk_local_cumsum(g, vl)
    h, _ = chunk_fwd_h(k, v, g_cum, h0, vl, store_final=False)
    dh, dh0 = chunk_bwd_dh(q, do, g_cum, dht, vl, scale, want_dh0=h0 is not None)
    BK, BV = block(K), block(V)
    common = dict(H=H, HV=HV, K=K, V=V, BT=vl.chunk, BK=BK, BV=BV, HAS_G=g is not None,
                  IS_VARLEN=vl.is_varlen, PREC=dot_precision(q.dtype))  # fmt: skip
    dv = new_empty(v, *v.shape)
    grid = (triton.cdiv(V, BV), vl.NT, vl.grid_rows(B) * HV)
    o_dv_kernel[grid](k, q, do, g_cum, dh, dv, vl.cu, vl.idx, scale, T, DV=True, **common)
    NK = triton.cdiv(K, BK)
    # per value head; summed over each GVA group below
    dq = new_empty(q, B, T, HV, K, dtype=q.dtype if HV == H else torch.float32)
    dk = new_empty(q, B, T, HV, K, dtype=q.dtype if HV == H else torch.float32)
    dg = new_empty(q, NK, B, T, HV, dtype=torch.float32) if g is not None else None
    grid = (NK, vl.NT, vl.grid_rows(B) * HV)
    bwd_dqkg_kernel[grid](q, k, v, g_cum, h, do, dh, dq, dk, dg, vl.cu, vl.idx, scale, T, B * T, **common)
    if HV != H:
        dq = dq.view(B, T, H, HV // H, K).sum(3).to(q.dtype)
        dk = dk.view(B, T, H, HV // H, K).sum(3).to(k.dtype)
    if dg is not None:
        dg = dg.sum(0) if NK > 1 else dg[0]
    return dq, dk, dv, dg, dh0
