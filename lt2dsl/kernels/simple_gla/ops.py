"""torch.library registration of the `simple_gla` Triton kernels and the backend="triton" entry.

Custom ops (each with a fake implementation and a FLOP formula, so `torch.compile(fullgraph=True)`
traces through and `FlopCounterMode` counts them):
* `lt2dsl::simple_gla_chunk_fwd` / `lt2dsl::simple_gla_chunk_bwd`: the chunked kernels, tied by
  `register_autograd`.
* the shared token-recurrent kernels `lt2dsl::decay_fused_recurrent[_]` (decay/recurrent.py),
  used for decode and short calls that need no gradient.
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.custom_op import custom_op, register_chunk_flops

from ..decay.ops import chunk_flops, empty_grad
from ..gla.ops import chunk_schemas
from .chunk import chunk_simple_gla_bwd, chunk_simple_gla_fwd

# g `[B, T, HV]` (fp32) or None (no decay); the forward saves nothing beyond its inputs
_FWD, _BWD = chunk_schemas("Tensor?", "", 2)


@custom_op("lt2dsl::simple_gla_chunk_fwd", mutates_args=(), schema=_FWD)
def simple_gla_chunk_fwd(q, k, v, g, h0, cu_seqlens, scale):
    """o `[B, T, HV, V]` and final state `[N, HV, K, V]` (fp32)."""
    return chunk_simple_gla_fwd(q, k, v, g, scale, h0, cu_seqlens, store_final=True)


@simple_gla_chunk_fwd.register_fake
def _(q, k, v, g, h0, cu_seqlens, scale):
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return torch.empty_like(v), q.new_empty(N, v.shape[2], q.shape[3], v.shape[3], dtype=torch.float32)


@custom_op("lt2dsl::simple_gla_chunk_bwd", mutates_args=(), schema=_BWD)
def simple_gla_chunk_bwd(q, k, v, g, h0, cu_seqlens, do, dht, scale):
    """(dq, dk, dv, dg, dh0); dg and dh0 are empty tensors when g / h0 are None."""
    dq, dk, dv, dg, dh0 = chunk_simple_gla_bwd(q, k, v, g, scale, h0, do, dht, cu_seqlens)
    return dq, dk, dv, empty_grad(dg, q), empty_grad(dh0, q)


@simple_gla_chunk_bwd.register_fake
def _(q, k, v, g, h0, cu_seqlens, do, dht, scale):
    dg = torch.empty_like(g) if g is not None else q.new_empty(0, dtype=torch.float32)
    dh0 = torch.empty_like(h0) if h0 is not None else q.new_empty(0, dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dg, dh0


def _setup_context(ctx, inputs, output):
    q, k, v, g, h0, cu_seqlens, scale = inputs
    ctx.save_for_backward(q, k, v, g, h0, cu_seqlens)
    ctx.scale = scale
    ctx.set_materialize_grads(False)


def _backward(ctx, do, dht):
    q, k, v, g, h0, cu_seqlens = ctx.saved_tensors
    do = torch.zeros_like(v) if do is None else do.contiguous()
    dht = None if dht is None else dht.float().contiguous()
    dq, dk, dv, dg, dh0 = torch.ops.lt2dsl.simple_gla_chunk_bwd(
        q, k, v, g, h0, cu_seqlens, do, dht, ctx.scale
    )
    return dq, dk, dv, dg if g is not None else None, dh0 if h0 is not None else None, None, None


torch.library.register_autograd("lt2dsl::simple_gla_chunk_fwd", _backward, setup_context=_setup_context)


ops = torch.ops.lt2dsl
register_chunk_flops(ops.simple_gla_chunk_fwd, ops.simple_gla_chunk_bwd, chunk_flops)
