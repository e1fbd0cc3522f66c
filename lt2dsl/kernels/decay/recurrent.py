"""Fused token-recurrent Triton kernel for `simple_gla` and `gla` (decode and short prefill).

S_t = Diag(e^{g_t}) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ (s q_t), with g none, scalar `[B, T, HV]` or per
channel `[B, T, HV, K]`. One program keeps a `[K, BV]` slice of one (sequence, value head) state in
fp32 registers and walks the tokens. It reads its slice of h0 before writing anything and writes
only that slice, so the final state may be stored over h0 (in-place decode, no allocation).
Registered as `lt2dsl::decay_fused_recurrent` (returns a new state) and
`lt2dsl::decay_fused_recurrent_` (mutates `state`), both with fake implementations and FLOP formulas.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.utils.flop_counter import register_flop_formula

from lt2dsl.kernels.common.custom_op import custom_op
from lt2dsl.kernels.common.tl_util import kv_channels, tile_head_program

from ..common.backend import new_empty
from ..common.tiles import tuned
from .chunks import seq_start

# One config, never benchmarked: the in-place variant overwrites its own input state, so an
# autotuner timing several runs would apply the update several times. Hopper notes: elementwise
# products and row sums only (no tl.dot, no transposition), none of the known sm_90 miscompiles.
_CONFIGS = [triton.Config({}, num_warps=4, num_stages=1)]


@tuned(_CONFIGS, key=["H", "HV", "K", "V", "BV", "G_MODE"])
@triton.jit(do_not_specialize=["T"])
def fused_recurrent_kernel(
    q, k, v, g, o, h0, ht, cu_seqlens, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    G_MODE: tl.constexpr, HAS_H0: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    i_v, i_nh, i_n, i_hv, i_h = tile_head_program(H, HV)
    bos, T = seq_start(i_n, cu_seqlens, T, IS_VARLEN)
    o_k, o_v, m_k, m_v = kv_channels(i_v, K, V, BK, BV)
    m_h = m_k[:, None] & m_v[None, :]
    p_state = i_nh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :]

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        b_h += tl.load(h0 + p_state, mask=m_h, other=0.0).to(tl.float32)
    for t in range(T):
        p_qk = (bos + t) * H * K + i_h * K + o_k
        p_v = (bos + t) * HV * V + i_hv * V + o_v
        b_q = tl.load(q + p_qk, mask=m_k, other=0.0).to(tl.float32) * scale
        b_k = tl.load(k + p_qk, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + p_v, mask=m_v, other=0.0).to(tl.float32)
        if G_MODE == 1:
            b_h *= tl.exp(tl.load(g + (bos + t) * HV + i_hv))
        if G_MODE == 2:
            b_gk = tl.load(g + ((bos + t) * HV + i_hv) * K + o_k, mask=m_k, other=0.0)
            b_h *= tl.exp(b_gk)[:, None]
        b_h += b_k[:, None] * b_v[None, :]
        b_o = tl.sum(b_h * b_q[:, None], axis=0)
        tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_v)
    tl.store(ht + p_state, b_h.to(ht.dtype.element_ty), mask=m_h)


def _launch(q, k, v, g, scale, h0, ht, cu_seqlens):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    o = new_empty(v, *v.shape)
    BK = triton.next_power_of_2(K)
    # a small V slice keeps the [K, BV] fp32 state in registers and gives decode enough programs
    BV = min(32, triton.next_power_of_2(V))
    g_mode = 0 if g is None else (1 if g.dim() == 3 else 2)
    cu = None if cu_seqlens is None else cu_seqlens.to(torch.int32)
    grid = (triton.cdiv(V, BV), N * HV)
    fused_recurrent_kernel[grid](
        q, k, v, g, o, h0, ht, cu, scale, T,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, G_MODE=g_mode, HAS_H0=h0 is not None,
        IS_VARLEN=cu_seqlens is not None,
    )  # fmt: skip
    return o


@custom_op("lt2dsl::decay_fused_recurrent", mutates_args=())
def decay_fused_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, h0: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Token-recurrent forward (no autograd): o `[B, T, HV, V]` and the final state `[N, HV, K, V]` fp32."""
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    ht = new_empty(q, N, v.shape[2], q.shape[3], v.shape[3], dtype=torch.float32)
    return _launch(q, k, v, g, scale, h0, ht, cu_seqlens), ht


@decay_fused_recurrent.register_fake
def _(q, k, v, g, h0, cu_seqlens, scale):
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return torch.empty_like(v), q.new_empty(N, v.shape[2], q.shape[3], v.shape[3], dtype=torch.float32)


@custom_op("lt2dsl::decay_fused_recurrent_", mutates_args=("state",))
def decay_fused_recurrent_(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, state: torch.Tensor,
    cu_seqlens: torch.Tensor | None, scale: float,
) -> torch.Tensor:  # fmt: skip
    """As `decay_fused_recurrent`, reading the initial state from `state` (fp32) and overwriting it."""
    return _launch(q, k, v, g, scale, state, state, cu_seqlens)


@decay_fused_recurrent_.register_fake
def _(q, k, v, g, state, cu_seqlens, scale):
    return torch.empty_like(v)


def recurrent_flops(q_shape, v_shape) -> int:
    """5KV per token per value head (mixers.md summary table: decode FLOPs of RetNet/GLA)."""
    B, T, _, K = q_shape
    HV, V = v_shape[2], v_shape[3]
    return 5 * B * T * HV * K * V


@register_flop_formula([torch.ops.lt2dsl.decay_fused_recurrent, torch.ops.lt2dsl.decay_fused_recurrent_])
def _flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return recurrent_flops(q_shape, v_shape)
