"""Token-recurrent delta-rule kernel for decode (one or a few new tokens per sequence).

One program per (V tile, sequence x value head) loads its `[K, BV]` slice of the fp32 state once,
applies the recurrence of mixers.md §4–§6 token by token,

    S ← α S (GDN: α scalar; KDA: α per key row),   u = β (v − Sᵀk),   S ← S + k uᵀ,   o = Sᵀ (s q),

and writes the slice back once. The state may be written into the tensor it was read from
(`ht` = `h0`): every program owns its slice, so in-place needs no synchronisation. At batch 64,
16 heads, K = V = 128 the state is 64 MiB, read and written once; 4096 programs of 4 warps keep
the copy engines of every SM busy.

L2NORM normalises q and k in the kernel (x / sqrt(Σx² + 1e-6)), so decode needs no extra launch.

GATE 3 is GDN with its gates still raw: g points at the projection a and beta at b (rows `s_ab`
elements apart, any dtype), and the kernel forms g = −exp(A_log) · softplus(a + dt_bias) and
β = s · σ(b) per token and value head in fp32, as `fused.gdn_gate` would have stored them (the
same operations in the same order, so the state and output are bit-for-bit the two-launch ones):
the gates' launch and their `[B, T, HV]` round trip are gone. Other gates ignore A_log, dt_bias,
s_ab and beta_scale.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.tl_util import kv_channels, tile_head_program
from lt2dsl.kernels.delta.helpers import rsum, seq_bounds
from lt2dsl.kernels.delta.tiles import load_tile, store_tile
from lt2dsl.kernels.fused.triton_act import _softplus


@triton.jit
def delta_recurrent_kernel(
    q, k, v, g, beta, h0, o, ht, cu_seqlens, T, scale, A_log, dt_bias, s_ab, beta_scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, USE_H0: tl.constexpr, STORE_FINAL: tl.constexpr, L2NORM: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    i_v, i_nh, i_n, i_hv, i_h = tile_head_program(H, HV)
    bos, eos = seq_bounds(i_n, cu_seqlens, T, IS_VARLEN)
    ok, ov, m_k, m_v = kv_channels(i_v, K, V, BK, BV)
    s_base = i_nh.to(tl.int64) * K * V
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        # Row-masked tile loads stay vectorised: the state stream is all this kernel's cost.
        S += load_tile(h0 + s_base, 0, K, V, i_v * BV, V, BK, BV).to(tl.float32)
    b64 = bos.to(tl.int64)
    p_q = q + (b64 * H + i_h) * K + ok
    p_k = k + (b64 * H + i_h) * K + ok
    p_v = v + (b64 * HV + i_hv) * V + ov
    p_o = o + (b64 * HV + i_hv) * V + ov
    p_beta = beta + b64 * HV + i_hv
    if GATE == 2:
        p_g = g + (b64 * HV + i_hv) * K + ok
    else:
        p_g = g + b64 * HV + i_hv
    if GATE == 3:
        p_g = g + b64 * s_ab + i_hv
        p_beta = beta + b64 * s_ab + i_hv
        b_A = tl.exp(tl.load(A_log + i_hv).to(tl.float32))
        b_dt = tl.load(dt_bias + i_hv).to(tl.float32)
    for _ in range(bos, eos):
        b_q = tl.load(p_q, mask=m_k, other=0.0).to(tl.float32)
        b_k = tl.load(p_k, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_v, other=0.0).to(tl.float32)
        if GATE == 3:
            b_beta = tl.sigmoid(tl.load(p_beta).to(tl.float32)) * beta_scale
        else:
            b_beta = tl.load(p_beta).to(tl.float32)
        if L2NORM:
            b_q = b_q / tl.sqrt(rsum(b_q * b_q, 0) + 1e-6)
            b_k = b_k / tl.sqrt(rsum(b_k * b_k, 0) + 1e-6)
        if GATE == 1:
            S = S * tl.exp(tl.load(p_g).to(tl.float32))
        if GATE == 2:
            S = S * tl.exp(tl.load(p_g, mask=m_k, other=0.0).to(tl.float32))[:, None]
        if GATE == 3:
            sp, _ = _softplus(tl.load(p_g).to(tl.float32) + b_dt)
            S = S * tl.exp(-b_A * sp)
        u = b_beta * (b_v - rsum(b_k[:, None] * S, 0))
        S += b_k[:, None] * u[None, :]
        b_o = rsum((b_q * scale)[:, None] * S, 0)
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_v)
        p_q += H * K
        p_k += H * K
        p_v += HV * V
        p_o += HV * V
        if GATE == 3:
            p_beta += s_ab
            p_g += s_ab
        else:
            p_beta += HV
        if GATE == 2:
            p_g += HV * K
        if GATE < 2:
            p_g += HV
    if STORE_FINAL:
        store_tile(ht + s_base, S, 0, K, V, i_v * BV, V, BK, BV)
