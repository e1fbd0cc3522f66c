"""Dispatch shared by the Triton entries of `simple_gla` and `gla`: input preparation, the choice
between the chunked kernels (with autograd) and the fused recurrent kernel (decode), in-place states.
"""

from __future__ import annotations

import torch

from ..common.backend import check_triton_dtype
from .chunks import CHUNK
from .recurrent import decay_fused_recurrent, decay_fused_recurrent_

# calls with at most this many tokens per sequence and no gradient use the token-recurrent kernel
RECURRENT_MAX_T = 64


def prepare_inputs(q, k, v, g, initial_state):
    """Contiguous q, k, v; fp32 contiguous g and initial state (the kernels' layouts)."""
    check_triton_dtype(q)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = None if g is None else g.float().contiguous()
    h0 = None if initial_state is None else initial_state.float().contiguous()
    return q, k, v, g, h0


def empty_grad(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an empty fp32 tensor stands for "no gradient"."""
    return t if t is not None else like.new_empty(0, dtype=torch.float32)


def chunk_flops(q_shape, v_shape, extra_per_token: int = 0) -> int:
    """Chunked forward FLOPs, mixers.md summary table: (2C(K + V) + 4KV + extra) per token and value head."""
    B, T, _, K = q_shape
    HV, V = v_shape[2], v_shape[3]
    C = min(CHUNK, T)
    return B * T * HV * (2 * C * (K + V) + 4 * K * V + extra_per_token)


def needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def run_decay_triton(chunk_op, q, k, v, g, h0, initial_state, scale, want_final, inplace, cu_seqlens):
    """Run the chunked op, or the fused recurrent kernel for short gradient-free calls; honour in-place."""
    cu = None if cu_seqlens is None else cu_seqlens.to(torch.int32)
    # with cu_seqlens, T is the packed length, so T ≤ 64 bounds every sequence without a host sync
    if not needs_grad(q, k, v, g, h0) and q.shape[1] <= RECURRENT_MAX_T:
        if inplace and initial_state.dtype == torch.float32 and initial_state.is_contiguous():
            o = decay_fused_recurrent_(q, k, v, g, initial_state, cu, scale)
            return o, initial_state
        o, ht = decay_fused_recurrent(q, k, v, g, h0, cu, scale)
    else:
        # chunk ops may return extra tensors saved for their backward (gla: the scores A)
        o, ht = chunk_op(q, k, v, g, h0, cu, scale)[:2]
    if inplace:
        with torch.no_grad():
            initial_state.copy_(ht)
        return o, initial_state
    return o, ht if want_final else None
