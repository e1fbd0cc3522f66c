"""torch.library registration of the `mlstm` Triton kernels and the backend="triton" entry.

Custom ops (each with a fake implementation and a FLOP formula): `lt2dsl::mlstm_chunk_fwd` /
`lt2dsl::mlstm_chunk_bwd` tied by `register_autograd`, and the token-recurrent decode kernels
`lt2dsl::mlstm_fused_recurrent[_]` (fused_recurrent.py).
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.custom_op import custom_op, register_chunk_flops

from ..common.backend import check_triton_dtype
from ..decay.chunks import CHUNK
from ..decay.ops import empty_grad, needs_grad
from .chunk import chunk_mlstm_fwd
from .chunk_bwd import chunk_mlstm_bwd
from .fused_recurrent import INPUTS, mlstm_fused_recurrent, mlstm_fused_recurrent_

RECURRENT_MAX_T = 64


# h, C, n, m, m_tok, a_tok
_FWD = f"({INPUTS}, float scale, float eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
# the forward's output h and its m_tok, a_tok; the gradients of h and of the final (C, n, m)
_BWD_IN = "Tensor o, Tensor m_tok, Tensor a_tok, Tensor do, Tensor? dCt, Tensor? dnt, Tensor? dmt"
_GRADS = (
    "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"  # dq, dk, dv, di, df, dC0, dn0, dm0
)
_BWD = f"({INPUTS}, {_BWD_IN}, float scale, float eps) -> {_GRADS}"


@custom_op("lt2dsl::mlstm_chunk_fwd", mutates_args=(), schema=_FWD)
def mlstm_chunk_fwd(q, k, v, i, f, C0, n0, m0, cu_seqlens, scale, eps):
    """h `[B, T, H, V]`, final (C, n, m) fp32, and per-token m, a `[B, T, H]` saved for the backward."""
    state0 = None if C0 is None else (C0, n0, m0)
    h, (Ct, nt, mt), m_tok, a_tok = chunk_mlstm_fwd(q, k, v, i, f, scale, eps, state0, cu_seqlens)
    return h, Ct, nt, mt, m_tok, a_tok


@mlstm_chunk_fwd.register_fake
def _(q, k, v, i, f, C0, n0, m0, cu_seqlens, scale, eps):
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    B, T, H, K = q.shape
    f32 = torch.float32
    state = (
        q.new_empty(N, H, K, v.shape[3], dtype=f32),
        q.new_empty(N, H, K, dtype=f32),
        q.new_empty(N, H, dtype=f32),
    )
    return torch.empty_like(v), *state, q.new_empty(B, T, H, dtype=f32), q.new_empty(B, T, H, dtype=f32)


@custom_op("lt2dsl::mlstm_chunk_bwd", mutates_args=(), schema=_BWD)
def mlstm_chunk_bwd(q, k, v, i, f, C0, n0, m0, cu_seqlens, o, m_tok, a_tok, do, dCt, dnt, dmt, scale, eps):
    """(dq, dk, dv, di, df, dC0, dn0, dm0); the state gradients are empty tensors without C0."""
    state0 = None if C0 is None else (C0, n0, m0)
    dstate = None if dCt is None and dnt is None and dmt is None else (dCt, dnt, dmt)
    grads = chunk_mlstm_bwd(q, k, v, i, f, scale, eps, state0, cu_seqlens, o, m_tok, a_tok, do, dstate)
    dq, dk, dv, di, df, dC0, dn0, dm0 = grads
    return dq, dk, dv, di, df, empty_grad(dC0, q), empty_grad(dn0, q), empty_grad(dm0, q)


@mlstm_chunk_bwd.register_fake
def _(q, k, v, i, f, C0, n0, m0, cu_seqlens, o, m_tok, a_tok, do, dCt, dnt, dmt, scale, eps):
    def like(x):
        return torch.empty_like(x) if x is not None else q.new_empty(0, dtype=torch.float32)

    f32 = torch.float32
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(i, dtype=f32),
            torch.empty_like(f, dtype=f32), like(C0), like(n0), like(m0))  # fmt: skip


def _setup_context(ctx, inputs, output):
    q, k, v, i, f, C0, n0, m0, cu_seqlens, scale, eps = inputs
    h, _, _, _, m_tok, a_tok = output
    ctx.save_for_backward(q, k, v, i, f, C0, n0, m0, cu_seqlens, h, m_tok, a_tok)
    ctx.scale, ctx.eps = scale, eps
    ctx.set_materialize_grads(False)


def _backward(ctx, dh, dCt, dnt, dmt, _dm_tok, _da_tok):
    q, k, v, i, f, C0, n0, m0, cu_seqlens, h, m_tok, a_tok = ctx.saved_tensors
    dh = torch.zeros_like(v) if dh is None else dh.contiguous()
    dCt, dnt, dmt = (None if x is None else x.float().contiguous() for x in (dCt, dnt, dmt))
    grads = torch.ops.lt2dsl.mlstm_chunk_bwd(
        q, k, v, i, f, C0, n0, m0, cu_seqlens, h, m_tok, a_tok, dh, dCt, dnt, dmt, ctx.scale, ctx.eps
    )
    dq, dk, dv, di, df, dC0, dn0, dm0 = grads
    has0 = C0 is not None
    return (dq, dk, dv, di.to(i.dtype), df.to(f.dtype), dC0 if has0 else None, dn0 if has0 else None,
            dm0 if has0 else None, None, None, None)  # fmt: skip


torch.library.register_autograd("lt2dsl::mlstm_chunk_fwd", _backward, setup_context=_setup_context)


def chunk_flops(q_shape, v_shape) -> int:
    """(2C(K + V) + 4KV + 4K + C) per token and head, mixers.md summary table (mLSTM)."""
    B, T, H, K = q_shape
    V = v_shape[3]
    C = min(CHUNK, T)
    return B * T * H * (2 * C * (K + V) + 4 * K * V + 4 * K + C)


register_chunk_flops(torch.ops.lt2dsl.mlstm_chunk_fwd, torch.ops.lt2dsl.mlstm_chunk_bwd, chunk_flops)


def mlstm_triton(q, k, v, i, f, scale, eps, initial_state, want_final, inplace, cu_seqlens):
    """backend="triton": chunked kernels with autograd, or the fused recurrent kernel for decode."""
    check_triton_dtype(q)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    i, f = i.float().contiguous(), f.float().contiguous()
    C0, n0, m0 = (
        (None, None, None) if initial_state is None else (s.float().contiguous() for s in initial_state)
    )
    cu = None if cu_seqlens is None else cu_seqlens.to(torch.int32)
    if not needs_grad(q, k, v, i, f, C0, n0, m0) and q.shape[1] <= RECURRENT_MAX_T:
        if inplace and all(s.dtype == torch.float32 and s.is_contiguous() for s in initial_state):
            h = mlstm_fused_recurrent_(q, k, v, i, f, *initial_state, cu, scale, eps)
            return h, initial_state
        h, Ct, nt, mt = mlstm_fused_recurrent(q, k, v, i, f, C0, n0, m0, cu, scale, eps)
    else:
        h, Ct, nt, mt, _, _ = mlstm_chunk_fwd(q, k, v, i, f, C0, n0, m0, cu, scale, eps)
    if inplace:
        with torch.no_grad():
            for dst, src in zip(initial_state, (Ct, nt, mt)):
                dst.copy_(src)
        return h, initial_state
    return h, (Ct, nt, mt) if want_final else None
