"""torch.library registration of DSA's sparse attention and the `backend="triton"` entry of `dsa`.

`lt2dsl::dsa_attn_fwd` -> (o, lse) and `lt2dsl::dsa_attn_bwd` -> (dq, dk, dv) with fake impls, autograd
and FLOP formulas. The selection (an integer tensor) enters as an input without gradient.
"""

from __future__ import annotations

import itertools

import torch
from torch.utils.flop_counter import register_flop_formula

from lt2dsl.kernels.common.custom_op import custom_op

from ..common.backend import check_triton_dtype
from . import triton_attn
from .reference import to_global
from .triton_attn import sparse_attn_bwd, sparse_attn_fwd
from .triton_indexer import dsa_indexer_triton

Tensor = torch.Tensor


@custom_op("lt2dsl::dsa_attn_fwd", mutates_args=())
def dsa_attn_fwd_op(q: Tensor, k: Tensor, v: Tensor, indices: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Sparse attention forward: (o `[B, Tq, HQ, V]`, lse `[HQ, B·Tq]`)."""
    return sparse_attn_fwd(q, k, v, indices, scale)


@dsa_attn_fwd_op.register_fake
def _(q, k, v, indices, scale):
    B, Tq, HQ, _ = q.shape
    return q.new_empty(B, Tq, HQ, v.shape[-1], dtype=v.dtype), q.new_empty(HQ, B * Tq, dtype=torch.float32)


@custom_op("lt2dsl::dsa_attn_bwd", mutates_args=())
def dsa_attn_bwd_op(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, indices: Tensor, scale: float,
    dkdv: str,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Sparse attention backward: (dq, dk, dv); `dkdv` names how dk, dv are summed
    (`triton_attn.DKDV_MODES`; "" for `triton_attn.DEFAULT_DKDV`)."""
    do, k, v = do.contiguous(), k.contiguous(), v.contiguous()
    return sparse_attn_bwd(do, q, k, v, o, lse, indices, scale, dkdv or triton_attn.DEFAULT_DKDV)


@dsa_attn_bwd_op.register_fake
def _(do, q, k, v, o, lse, indices, scale, dkdv):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, indices, scale = inputs
    ctx.scale = scale
    ctx.save_for_backward(q, k, v, indices, *output)


def _backward(ctx, do, dlse):
    q, k, v, indices, o, lse = ctx.saved_tensors
    dq, dk, dv = dsa_attn_bwd_op(do, q, k, v, o, lse, indices, ctx.scale, "")
    return dq, dk, dv, None, None


dsa_attn_fwd_op.register_autograd(_backward, setup_context=_setup)


@register_flop_formula(torch.ops.lt2dsl.dsa_attn_fwd)
def _fwd_flops(q, k, v, indices, scale, *args, **kwargs) -> int:
    """2·(K + V) per selected key and query head (upper bound: every slot filled)."""
    B, Tq, HQ, K = q
    return 2 * B * Tq * HQ * (K + v[-1]) * indices[-1]


@register_flop_formula(torch.ops.lt2dsl.dsa_attn_bwd)
def _bwd_flops(do, q, k, v, o, lse, indices, scale, dkdv, *args, **kwargs) -> int:
    B, Tq, HQ, K = q
    return 5 * B * Tq * HQ * (K + v[-1]) * indices[-1]


@custom_op("lt2dsl::dsa_indexer", mutates_args=())
def dsa_indexer_op(
    q_idx: Tensor, k_idx: Tensor, w_idx: Tensor | None, topk: int, idx_scale: float, ordered: bool = True
) -> Tensor:
    """Lightning indexer + top-k: `[B, Tq, topk]` indices (no gradient: the choice is discrete);
    rank order, or with `ordered=False` any order, −1 pads possibly among them (the same set)."""
    return dsa_indexer_triton(q_idx, k_idx, w_idx, topk=topk, idx_scale=idx_scale, ordered=ordered)


@dsa_indexer_op.register_fake
def _(q_idx, k_idx, w_idx, topk, idx_scale, ordered=True):
    return q_idx.new_empty(*q_idx.shape[:2], topk, dtype=torch.long)


@register_flop_formula(torch.ops.lt2dsl.dsa_indexer)
def _indexer_flops(q_idx, k_idx, w_idx, topk, idx_scale, *args, **kwargs) -> int:
    """2·HI·DI per (query, key) pair of the full score matrix (the kernel skips future key blocks)."""
    B, Tq, HI, DI = q_idx
    return 2 * B * Tq * k_idx[1] * HI * DI


def dsa_triton(
    q, k, v, q_idx, k_idx, w_idx, *, topk: int, scale, idx_scale, indices, cu_seqlens, ordered=True
):
    """`dsa(backend="triton")`: Triton indexer + top-k, then the sparse attention custom op; the
    returned selection is in rank order only if `ordered` (the attention does not need it)."""
    check_triton_dtype(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if cu_seqlens is not None and isinstance(cu_seqlens, tuple | list):
        raise ValueError("the Triton DSA takes one cu_seqlens (Tq == Tk per sequence)")
    local = indices
    if local is None:
        local = _indexer(q_idx, k_idx, w_idx, topk, idx_scale, cu_seqlens, ordered)
    glob = local if cu_seqlens is None else to_global(local, cu_seqlens)
    # k, v as they are (the kernel takes their strides): in decode they are views of the KV cache
    o = dsa_attn_fwd_op(q.contiguous(), k, v, glob.contiguous(), scale)[0]
    return o, local


def _indexer(q_idx, k_idx, w_idx, topk, idx_scale, cu_seqlens, ordered=True):
    """Indexer per packed sequence (indices local to each sequence, as the peer)."""
    idx_scale = q_idx.shape[-1] ** -0.5 if idx_scale is None else float(idx_scale)
    q_idx, k_idx = q_idx.contiguous(), k_idx.contiguous()
    w_idx = None if w_idx is None else w_idx.contiguous()
    if cu_seqlens is None:
        return dsa_indexer_op(q_idx, k_idx, w_idx, topk, idx_scale, ordered)
    cu = cu_seqlens.tolist()
    parts = [
        dsa_indexer_op(
            q_idx[:, a:b].contiguous(),
            k_idx[:, a:b].contiguous(),
            None if w_idx is None else w_idx[:, a:b].contiguous(),
            topk,
            idx_scale,
            ordered,
        )
        for a, b in itertools.pairwise(cu)
    ]
    return torch.cat(parts, dim=1)
