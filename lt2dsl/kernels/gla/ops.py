"""torch.library registration of the `gla` Triton kernels and the backend="triton" entry.

Custom ops (each with a fake implementation and a FLOP formula): `lt2dsl::gla_chunk_fwd` and
`lt2dsl::gla_chunk_bwd`, tied by `register_autograd`; decode and short gradient-free calls use the
shared token-recurrent kernel `lt2dsl::decay_fused_recurrent[_]` (decay/recurrent.py).
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.custom_op import custom_op, register_chunk_flops

from ..decay.chunks import CHUNK
from ..decay.ops import chunk_flops, empty_grad
from .chunk import chunk_gla_bwd, chunk_gla_fwd

# elementwise 16 × 16 diagonal sub-blocks: ≈ 3·16·K per token (mixers.md §3(d))
_SUBCHUNK_FLOPS = 3 * 16


def chunk_schemas(g: str, saved: str, outputs: int) -> tuple[str, str]:
    """Schemas of a decay family's chunk forward and backward ops. Both take q, k `[B, T, H, K]`,
    v `[B, T, HV, V]`, the log decay g (`g`: its schema type), h0 `[N, HV, K, V]` (fp32) and
    cu_seqlens `[N + 1]`; the forward returns `outputs` tensors, the backward takes what the forward
    saved (`saved`, a schema fragment), do and dht, and returns dq, dk, dv, dg, dh0."""
    inputs = f"Tensor q, Tensor k, Tensor v, {g} g, Tensor? h0, Tensor? cu_seqlens"
    fwd = f"({inputs}, float scale) -> ({', '.join(['Tensor'] * outputs)})"
    bwd = (
        f"({inputs}, {saved}Tensor do, Tensor? dht, float scale) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
    )
    return fwd, bwd


# the forward's third output is A, the intra-chunk scores
_FWD, _BWD = chunk_schemas("Tensor", "Tensor A, ", 3)


@custom_op("lt2dsl::gla_chunk_fwd", mutates_args=(), schema=_FWD)
def gla_chunk_fwd(q, k, v, g, h0, cu_seqlens, scale):
    """o `[B, T, HV, V]`, final state `[N, HV, K, V]` (fp32) and the intra-chunk scores A
    `[B, T, HV, 64]` (fp32), saved for the backward instead of being recomputed."""
    return chunk_gla_fwd(q, k, v, g, scale, h0, cu_seqlens, store_final=True)


@gla_chunk_fwd.register_fake
def _(q, k, v, g, h0, cu_seqlens, scale):
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    B, T, HV, V = v.shape
    ht = q.new_empty(N, HV, q.shape[3], V, dtype=torch.float32)
    return torch.empty_like(v), ht, q.new_empty(B, T, HV, CHUNK, dtype=torch.float32)


@custom_op("lt2dsl::gla_chunk_bwd", mutates_args=(), schema=_BWD)
def gla_chunk_bwd(q, k, v, g, h0, cu_seqlens, A, do, dht, scale):
    """(dq, dk, dv, dg, dh0); dh0 is an empty tensor when h0 is None."""
    dq, dk, dv, dg, dh0 = chunk_gla_bwd(q, k, v, g, A, scale, h0, do, dht, cu_seqlens)
    return dq, dk, dv, dg, empty_grad(dh0, q)


@gla_chunk_bwd.register_fake
def _(q, k, v, g, h0, cu_seqlens, A, do, dht, scale):
    dh0 = torch.empty_like(h0) if h0 is not None else q.new_empty(0, dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g), dh0


def _setup_context(ctx, inputs, output):
    q, k, v, g, h0, cu_seqlens, scale = inputs
    ctx.save_for_backward(q, k, v, g, h0, cu_seqlens, output[2])
    ctx.scale = scale
    ctx.set_materialize_grads(False)


def _backward(ctx, do, dht, dA_unused):
    q, k, v, g, h0, cu_seqlens, A = ctx.saved_tensors
    do = torch.zeros_like(v) if do is None else do.contiguous()
    dht = None if dht is None else dht.float().contiguous()
    dq, dk, dv, dg, dh0 = torch.ops.lt2dsl.gla_chunk_bwd(q, k, v, g, h0, cu_seqlens, A, do, dht, ctx.scale)
    return dq, dk, dv, dg, dh0 if h0 is not None else None, None, None


torch.library.register_autograd("lt2dsl::gla_chunk_fwd", _backward, setup_context=_setup_context)


def _flops(q_shape, v_shape) -> int:
    return chunk_flops(q_shape, v_shape, _SUBCHUNK_FLOPS * q_shape[3])


register_chunk_flops(torch.ops.lt2dsl.gla_chunk_fwd, torch.ops.lt2dsl.gla_chunk_bwd, _flops)
