"""torch.library registration of the Triton attention kernels, and the `backend="triton"` entry.

`lt2dsl::attn_fwd` -> (o, lse) and `lt2dsl::attn_bwd` -> (dq, dk, dv, dgate) are opaque custom ops
with fake (meta) implementations, autograd wiring and FLOP formulas, so `torch.compile(fullgraph=True)`
traces through and `FlopCounterMode` counts them. Integer encodings: `window = 0` means no window,
`kstride` / `koff` place key c at position c·kstride + koff, `qoff` is the position of query row 0;
`cu_q` / `cu_k` are int32 offsets of a packed batch (or None); `recipe` names the backward's
`AttnRecipe` (`recipe.RECIPES`, "" for the default of the call's shape).
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula

from lt2dsl.kernels.common.custom_op import custom_op

from ..common.backend import check_triton_dtype
from .recipe import pick
from .triton_bwd import attn_bwd
from .triton_decode import attention_decode_triton
from .triton_fwd import attn_fwd

Tensor = torch.Tensor


def _cu(cu_q: Tensor | None, cu_k: Tensor | None):
    return None if cu_q is None else (cu_q.tolist(), cu_k.tolist())


@custom_op("lt2dsl::attn_fwd", mutates_args=())
def attn_fwd_op(
    q: Tensor, k: Tensor, v: Tensor, gate: Tensor | None, scale: float, causal: bool, window: int,
    cu_q: Tensor | None, cu_k: Tensor | None, kstride: int, koff: int, qoff: int, recipe: str,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Tiled attention forward; returns (o `[B, Tq, HQ, DV]`, lse `[HQ, B·Tq]` fp32 log2 units).
    `recipe` is the backward's (autograd passes it on)."""
    return attn_fwd(q, k, v, gate, scale, causal, window or None, _cu(cu_q, cu_k), kstride, koff, qoff)


@attn_fwd_op.register_fake
def _(q, k, v, gate, scale, causal, window, cu_q, cu_k, kstride, koff, qoff, recipe):
    B, Tq, HQ, _ = q.shape
    return q.new_empty(B, Tq, HQ, v.shape[-1], dtype=v.dtype), q.new_empty(HQ, B * Tq, dtype=torch.float32)


@custom_op("lt2dsl::attn_bwd", mutates_args=())
def attn_bwd_op(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, gate: Tensor | None,
    scale: float, causal: bool, window: int, cu_q: Tensor | None, cu_k: Tensor | None,
    kstride: int, koff: int, qoff: int, recipe: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients of `attn_fwd_op`'s o by the named recipe; dgate is an empty tensor without a gate."""
    cu = _cu(cu_q, cu_k)
    how = pick(recipe, window or None, cu, kstride, koff, qoff)
    dq, dk, dv, dg = attn_bwd(
        do.contiguous(), q, k, v, o, lse, gate, scale, causal, window or None, cu, kstride, koff, qoff, how
    )
    return dq, dk, dv, (q.new_empty(0) if dg is None else dg)


@attn_bwd_op.register_fake
def _(do, q, k, v, o, lse, gate, scale, causal, window, cu_q, cu_k, kstride, koff, qoff, recipe):
    dg = q.new_empty(0) if gate is None else torch.empty_like(gate)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dg


def _setup(ctx, inputs, output):
    q, k, v, gate, *rest = inputs
    ctx.rest = rest
    ctx.save_for_backward(q, k, v, gate, *output)


def _backward(ctx, do, dlse):
    q, k, v, gate, o, lse = ctx.saved_tensors
    dq, dk, dv, dg = attn_bwd_op(do, q, k, v, o, lse, gate, *ctx.rest)
    return dq, dk, dv, (None if gate is None else dg), *([None] * len(ctx.rest))


attn_fwd_op.register_autograd(_backward, setup_context=_setup)


def visible_pairs(Tq: int, Tk: int, causal: bool, window: int, kstride: int, koff: int, qoff: int) -> int:
    """Number of (query, key) pairs the masks let through (one sequence, one head)."""
    pos = torch.arange(Tq, dtype=torch.int64) + qoff
    if not causal:
        return Tq * Tk
    hi = torch.where(pos >= koff, torch.div(pos - koff, kstride, rounding_mode="floor") + 1, 0).clamp(max=Tk)
    lo = (pos - window + 1).clamp(min=0) if window else torch.zeros_like(pos)
    return int((hi - lo).clamp(min=0).sum())


@register_flop_formula(torch.ops.lt2dsl.attn_fwd)
def _fwd_flops(q, k, v, gate, scale, causal, window, cu_q, cu_k, kstride, koff, qoff, *args, **kwargs) -> int:
    """2·(K + V) FLOPs per visible pair and query head (QKᵀ and PV); varlen counted as one sequence."""
    B, Tq, HQ, K = q
    return 2 * B * HQ * (K + v[-1]) * visible_pairs(Tq, k[1], causal, window, kstride, koff, qoff)


@register_flop_formula(torch.ops.lt2dsl.attn_bwd)
def _bwd_flops(
    do, q, k, v, o, lse, gate, scale, causal, window, cu_q, cu_k, kstride, koff, qoff, *args, **kwargs
) -> int:
    """Recompute QKᵀ plus dV, dP, dQ, dK: 2.5× the forward's matmul FLOPs."""
    B, Tq, HQ, K = q
    return 5 * B * HQ * (K + v[-1]) * visible_pairs(Tq, k[1], causal, window, kstride, koff, qoff)


@custom_op("lt2dsl::attn_decode", mutates_args=())
def attn_decode_op(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_seqlens: Tensor,
    gate: Tensor | None,
    scale: float,
    window: int,
    ring: bool,
) -> Tensor:
    """Flash-decoding forward (no autograd): see `decode.attention_decode`."""
    return attention_decode_triton(
        q, k_cache, v_cache, cache_seqlens, window=window or None, ring=ring, gate=gate, scale=scale
    )


@attn_decode_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, gate, scale, window, ring):
    return q.new_empty(*q.shape[:3], v_cache.shape[-1], dtype=v_cache.dtype)


@register_flop_formula(torch.ops.lt2dsl.attn_decode)
def _decode_flops(q, k_cache, v_cache, cache_seqlens, gate, scale, window, ring, *args, **kwargs) -> int:
    """Upper bound 2·(K + V) per query head, new query and cached slot (lengths are data)."""
    B, Tq, HQ, K = q
    n = k_cache[1] if not window else min(k_cache[1], window)
    return 2 * B * Tq * HQ * (K + v_cache[-1]) * n


def decode_eligible(q, k, v, causal: bool, cu_seqlens) -> bool:
    """Route small-Tq, gradient-free causal calls to the flash-decoding kernel (lowering's decode)."""
    if not causal or cu_seqlens is not None:
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return False
    return q.shape[1] * (q.shape[2] // k.shape[2]) <= 64 and k.shape[1] >= 4 * q.shape[1]


def attention_triton(
    q, k, v, *, causal: bool, window, gate, scale: float, cu_seqlens=None, recipe: str = ""
) -> Tensor:
    """`attention(backend="triton")`: inputs already validated by the public op; `recipe` names the
    backward's `AttnRecipe` ("" for the default)."""
    check_triton_dtype(q, k, v)
    gate = None if gate is None else gate.contiguous()
    Tq, Tk = q.shape[1], k.shape[1]
    if decode_eligible(q, k, v, causal, cu_seqlens) and (gate is None or not gate.requires_grad):
        # k, v as they are: the decode kernel reads strided caches (the lowering's are views)
        seqlens = torch.full((q.shape[0],), Tk, dtype=torch.int32, device=q.device)
        return attn_decode_op(q.contiguous(), k, v, seqlens, gate, scale, window or 0, False)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    cu_q = cu_k = None
    if cu_seqlens is not None:
        pair = cu_seqlens if isinstance(cu_seqlens, tuple | list) else (cu_seqlens, cu_seqlens)
        cu_q, cu_k = (c.to(device=q.device, dtype=torch.int32) for c in pair)
    if recipe:  # an unknown name, or "ds" where it does not apply, fails here rather than in the backward
        pick(recipe, window or None, cu_seqlens, 1, 0, Tk - Tq)
    return attn_fwd_op(q, k, v, gate, scale, causal, window or 0, cu_q, cu_k, 1, 0, Tk - Tq, recipe)[0]
