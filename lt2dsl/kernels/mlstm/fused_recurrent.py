"""Fused token-recurrent Triton kernel of the stabilised mLSTM (decode and short prefill).

One program owns one (sequence, head) and walks the V slices of its state; inside a slice it steps
through the tokens (mixers.md §8(b)): m ← max(logσ(f̃) + m, ĩ), C ← e^{logσ(f̃) + m_old − m} C +
e^{ĩ − m} k vᵀ, n likewise, h = Cᵀq̃ / (max(|nᵀq̃|, e^{−m}) + ε). n and m are recomputed per slice
from the initial state (a K-vector, cheap) and written once after the last slice, so every slice
reads the original (n, m) and the final state can overwrite the initial one (in-place decode).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.utils.flop_counter import register_flop_formula

from lt2dsl.kernels.common.custom_op import custom_op

from ..common.backend import new_empty
from ..common.tiles import tuned
from ..decay.chunks import seq_start

# One config, never benchmarked: the in-place variant overwrites its own input state, so an
# autotuner timing several runs would apply the update several times. Hopper notes: elementwise
# products and row sums only (no tl.dot, no transposition), none of the known sm_90 miscompiles.
_CONFIGS = [triton.Config({}, num_warps=4, num_stages=1)]


@tuned(_CONFIGS, key=["H", "K", "V", "BV"])
@triton.jit(do_not_specialize=["T"])
def fused_recurrent_kernel(
    q, k, v, ig, fg, o, C0, n0, m0, Ct, nt, mt, cu_seqlens, scale, eps, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_H0: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    i_nh = tl.program_id(0)
    i_n, i_h = i_nh // H, i_nh % H
    bos, T = seq_start(i_n, cu_seqlens, T, IS_VARLEN)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    b_n = tl.zeros([BK], dtype=tl.float32)
    b_m = tl.sum(tl.zeros([1], dtype=tl.float32))
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        p_state = i_nh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :]
        b_C = tl.zeros([BK, BV], dtype=tl.float32)
        b_n = tl.zeros([BK], dtype=tl.float32)
        b_m = tl.sum(tl.zeros([1], dtype=tl.float32))
        if HAS_H0:
            b_C += tl.load(C0 + p_state, mask=m_k[:, None] & m_v[None, :], other=0.0)
            b_n += tl.load(n0 + i_nh.to(tl.int64) * K + o_k, mask=m_k, other=0.0)
            b_m += tl.load(m0 + i_nh)
        for t in range(T):
            p_t = (bos + t) * H + i_h
            b_q = tl.load(q + p_t * K + o_k, mask=m_k, other=0.0).to(tl.float32) * scale
            b_k = tl.load(k + p_t * K + o_k, mask=m_k, other=0.0).to(tl.float32)
            b_v = tl.load(v + p_t * V + o_v, mask=m_v, other=0.0).to(tl.float32)
            b_i = tl.load(ig + p_t).to(tl.float32)
            b_fx = tl.load(fg + p_t).to(tl.float32)
            # logσ(x) = min(x, 0) − log(1 + e^{−|x|}), stable for either sign
            b_lf = tl.minimum(b_fx, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(b_fx)))
            m_new = tl.maximum(b_lf + b_m, b_i)
            b_fw = tl.exp(b_lf + b_m - m_new)
            b_iw = tl.exp(b_i - m_new)
            b_C = b_fw * b_C + b_iw * b_k[:, None] * b_v[None, :]
            b_n = b_fw * b_n + b_iw * b_k
            b_m = m_new
            b_den = tl.maximum(tl.abs(tl.sum(b_n * b_q)), tl.exp(-b_m)) + eps
            b_h = tl.sum(b_C * b_q[:, None], axis=0) / b_den
            tl.store(o + p_t * V + o_v, b_h.to(o.dtype.element_ty), mask=m_v)
        tl.store(Ct + p_state, b_C, mask=m_k[:, None] & m_v[None, :])
    tl.store(nt + i_nh.to(tl.int64) * K + o_k, b_n, mask=m_k)
    tl.store(mt + i_nh, b_m)


def _launch(q, k, v, i, f, scale, eps, state0, state_out, cu_seqlens):
    B, T, H, K = q.shape
    V = v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    o = new_empty(v, *v.shape)
    C0, n0, m0 = (None, None, None) if state0 is None else state0
    Ct, nt, mt = state_out
    cu = None if cu_seqlens is None else cu_seqlens.to(torch.int32)
    fused_recurrent_kernel[(N * H,)](
        q, k, v, i, f, o, C0, n0, m0, Ct, nt, mt, cu, scale, eps, T,
        H=H, K=K, V=V, BK=triton.next_power_of_2(K), BV=min(32, triton.next_power_of_2(V)),
        HAS_H0=state0 is not None, IS_VARLEN=cu_seqlens is not None,
    )  # fmt: skip
    return o


def _new_state(q, v, N):
    H, K, V = q.shape[2], q.shape[3], v.shape[3]
    f32 = torch.float32
    return (
        new_empty(q, N, H, K, V, dtype=f32),
        new_empty(q, N, H, K, dtype=f32),
        new_empty(q, N, H, dtype=f32),
    )


# the inputs every mLSTM op takes first: q, k `[B, T, H, K]`, v `[B, T, H, V]`, the gate
# pre-activations i, f `[B, T, H]`, the initial state C0 `[N, H, K, V]`, n0 `[N, H, K]`, m0 `[N, H]`
# (fp32; all three or none), cu_seqlens `[N + 1]`
INPUTS = (
    "Tensor q, Tensor k, Tensor v, Tensor i, Tensor f, Tensor? C0, Tensor? n0, Tensor? m0, Tensor? cu_seqlens"
)


@custom_op(
    "lt2dsl::mlstm_fused_recurrent",
    mutates_args=(),
    schema=f"({INPUTS}, float scale, float eps) -> (Tensor, Tensor, Tensor, Tensor)",
)
def mlstm_fused_recurrent(q, k, v, i, f, C0, n0, m0, cu_seqlens, scale, eps):
    """Token-recurrent forward (no autograd): h `[B, T, H, V]` and the final (C, n, m) in fp32."""
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    state0 = None if C0 is None else (C0, n0, m0)
    out = _new_state(q, v, N)
    return _launch(q, k, v, i, f, scale, eps, state0, out, cu_seqlens), *out


@mlstm_fused_recurrent.register_fake
def _(q, k, v, i, f, C0, n0, m0, cu_seqlens, scale, eps):
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    H, K, V = q.shape[2], q.shape[3], v.shape[3]
    f32 = torch.float32
    return (torch.empty_like(v), q.new_empty(N, H, K, V, dtype=f32), q.new_empty(N, H, K, dtype=f32),
            q.new_empty(N, H, dtype=f32))  # fmt: skip


# the state (C, n, m) is read and overwritten: `(a!)` marks each as mutated
_INPLACE = "Tensor q, Tensor k, Tensor v, Tensor i, Tensor f, Tensor(a!) C, Tensor(b!) n, Tensor(c!) m"


@custom_op(
    "lt2dsl::mlstm_fused_recurrent_",
    mutates_args=("C", "n", "m"),
    schema=f"({_INPLACE}, Tensor? cu_seqlens, float scale, float eps) -> Tensor",
)
def mlstm_fused_recurrent_(q, k, v, i, f, C, n, m, cu_seqlens, scale, eps):
    """As `mlstm_fused_recurrent`, reading the initial (C, n, m) (fp32) and overwriting them."""
    return _launch(q, k, v, i, f, scale, eps, (C, n, m), (C, n, m), cu_seqlens)


@mlstm_fused_recurrent_.register_fake
def _(q, k, v, i, f, C, n, m, cu_seqlens, scale, eps):
    return torch.empty_like(v)


def recurrent_flops(q_shape, v_shape) -> int:
    """(5KV + 5K) per token and head (mixers.md summary table: mLSTM decode)."""
    B, T, H, K = q_shape
    V = v_shape[3]
    return B * T * H * (5 * K * V + 5 * K)


@register_flop_formula(torch.ops.lt2dsl.mlstm_fused_recurrent)
def _flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return recurrent_flops(q_shape, v_shape)


@register_flop_formula(torch.ops.lt2dsl.mlstm_fused_recurrent_)
def _flops_(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return recurrent_flops(q_shape, v_shape)
