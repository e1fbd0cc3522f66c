"""`torch.library` ops of the delta-rule Triton kernels, their autograd, fake tensors and FLOPs.

Ops (namespace `lt2dsl`), gate 0 = DeltaNet, 1 = GDN (scalar decay), 2 = KDA (per-channel decay):

* `delta_chunk_fwd(q, k, v, g, beta, h0, cu_seqlens, gate, scale, want_final, save, *recipe)`
  returns (o, final state, and when `save` the tensors the backward reads: gate cumsum, T, KDA's
  scores Aqk, chunk states, U'). Absent outputs are empty tensors: a custom op has a fixed output
  arity. `*recipe` are the fields of the call's `DeltaRecipe` (fused_scan, grad_bk, kda_diag_span).
* `delta_chunk_bwd(...)` returns (dq, dk, dv, dg, dβ, dh0); registered as the forward's autograd.
* `delta_recurrent(...)` / `delta_recurrent_inplace(..., state)` for decode: token recurrence,
  the in-place variant writes the final state into `state` (declared as mutated).

`torch.compile(fullgraph=True)` traces these as opaque nodes through the fake implementations, and
`FlopCounterMode` counts them with the formulas registered here (mixers.md §4 (d)).
"""

from __future__ import annotations

from dataclasses import astuple

import torch
import triton
from torch.utils.flop_counter import register_flop_formula

from lt2dsl.kernels.common.custom_op import custom_op, dispatch_needed
from lt2dsl.kernels.common.norm import l2norm
from lt2dsl.kernels.delta.launch import BT, ChunkMeta, empty, kda_prep_fwd, pow2, state_fwd, wy_fwd
from lt2dsl.kernels.delta.launch_bwd import grad_chunks, state_bwd
from lt2dsl.kernels.delta.recipe import DeltaRecipe, DeltaShape, resolve_recipe
from lt2dsl.kernels.delta.recurrent import delta_recurrent_kernel

GATES = ("none", "scalar", "channel")
# Recurrent (decode) path for inference calls with at most this many tokens per sequence.
RECURRENT_MAX_T = 64

Tensor = torch.Tensor


def _none(x: Tensor) -> Tensor | None:
    return None if x.numel() == 0 else x


def _n_states(q: Tensor, cu_seqlens: Tensor | None) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1


def _chunk_fwd_outputs(q, k, v, beta, cu_seqlens, gate, want_final, save, alloc):
    """Shapes (and dtypes) of `delta_chunk_fwd`'s outputs; `alloc(shape, dtype)` makes each one."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = _n_states(q, cu_seqlens)
    f32 = torch.float32
    n_rows = ChunkMeta.max_chunks(B, T, N, cu_seqlens is not None)
    g_shape = (B * T, HV) if gate == 1 else (B * T, HV, K)
    return (
        alloc((N, HV, K, V) if want_final else (0,), f32),
        alloc(g_shape if save and gate else (0,), f32),
        alloc((B * T, HV, BT) if save else (0,), f32),
        # KDA's gated scores, which its output kernel and backward read (the scalar gates form P)
        alloc((B * T, HV, BT) if save and gate == 2 else (0,), f32),
        alloc((n_rows, HV, K, V) if save else (0,), q.dtype),
        alloc((B, T, HV, V) if save else (0,), v.dtype),
    )


def _chunk_fwd_impl(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, h0: Tensor | None,
    cu_seqlens: Tensor | None, gate: int, scale: float, want_final: bool, save: bool, fused_scan: bool,
    grad_bk: int, kda_diag_span: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    recipe = DeltaRecipe(fused_scan, grad_bk, kda_diag_span)
    meta = ChunkMeta(q.shape[0], q.shape[1], v.shape[2], cu_seqlens)
    Aqk = None
    if gate == 2:
        gcum, Ainv, Aqk = kda_prep_fwd(q, k, g, beta, scale, meta, recipe)
    else:
        gcum, Ainv = wy_fwd(k, g, beta, GATES[gate], meta)
    o, ht, h, vnew = state_fwd(
        q, k, v, gcum, beta, Ainv, Aqk, h0, scale, GATES[gate], meta, want_final, save, recipe
    )

    # Outputs may not alias each other, so every absent one is its own empty tensor.
    def e():
        return q.new_empty(0)

    if not save:
        return o, (ht if want_final else e()), e(), e(), e(), e(), e()
    Aqk = Aqk if Aqk is not None else e()
    return (o, ht if want_final else e(), gcum if gate else e(), Ainv, Aqk, h, vnew)


delta_chunk_fwd = custom_op("lt2dsl::delta_chunk_fwd", _chunk_fwd_impl, mutates_args=())


@delta_chunk_fwd.register_fake
def _(q, k, v, g, beta, h0, cu_seqlens, gate, scale, want_final, save, *recipe):
    outs = _chunk_fwd_outputs(
        q, k, v, beta, cu_seqlens, gate, want_final, save, lambda s, d: q.new_empty(s, dtype=d)
    )
    return (torch.empty_like(v), *outs)


def _chunk_bwd_impl(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, h0: Tensor | None,
    cu_seqlens: Tensor | None, gcum: Tensor, Ainv: Tensor, Aqk: Tensor, h: Tensor, vnew: Tensor, do: Tensor,
    dht: Tensor | None, gate: int, scale: float, fused_scan: bool, grad_bk: int, kda_diag_span: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    recipe = DeltaRecipe(fused_scan, grad_bk, kda_diag_span)
    B, T, H, K = q.shape
    HV = v.shape[2]
    meta = ChunkMeta(B, T, HV, cu_seqlens)
    if gate == 0:  # DeltaNet's split-form kernels run the scalar-gate code with b = 0
        gcum = torch.zeros(B * T, HV, dtype=torch.float32, device=q.device)
    dh, Y, dh0 = state_bwd(q, k, gcum, beta, Ainv, Aqk, do, dht, scale, GATES[gate], meta, h0 is not None)
    dq, dk, dv, dbeta, dg = grad_chunks(
        q, k, v, gcum, beta, h, dh, vnew, Y, do, scale, GATES[gate], meta, recipe
    )
    # Value heads sharing a q/k head add their gradients (grouped value heads).
    if HV == H:
        dq, dk = dq.view(q.shape).to(q.dtype), dk.view(k.shape).to(k.dtype)
    else:
        dq = dq.view(B, T, H, HV // H, K).sum(3).to(q.dtype)
        dk = dk.view(B, T, H, HV // H, K).sum(3).to(k.dtype)
    dg = dg.view(g.shape).to(g.dtype) if g is not None else q.new_empty(0)
    dh0 = dh0.to(h0.dtype) if h0 is not None else q.new_empty(0)
    return dq, dk, dv, dg, dbeta.view(beta.shape).to(beta.dtype), dh0


delta_chunk_bwd = custom_op("lt2dsl::delta_chunk_bwd", _chunk_bwd_impl, mutates_args=())


@delta_chunk_bwd.register_fake
def _(q, k, v, g, beta, h0, cu_seqlens, gcum, Ainv, Aqk, h, vnew, do, dht, gate, scale, *recipe):
    return (
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(v),
        torch.empty_like(g) if g is not None else q.new_empty(0),
        torch.empty_like(beta),
        torch.empty_like(h0) if h0 is not None else q.new_empty(0),
    )


def _setup_context(ctx, inputs, output):
    q, k, v, g, beta, h0, cu_seqlens, gate, scale, want_final, save, *recipe = inputs
    _, _, gcum, Ainv, Aqk, h, vnew = output
    ctx.save_for_backward(q, k, v, g, beta, h0, cu_seqlens, gcum, Ainv, Aqk, h, vnew)
    ctx.gate, ctx.scale, ctx.save, ctx.recipe = gate, scale, save, tuple(recipe)
    ctx.set_materialize_grads(False)


def _grads(ctx, do, dht, bwd):
    """Input gradients from the saved forward tensors; `bwd` is the op or its eager implementation."""
    q, k, v, g, beta, h0, cu_seqlens, gcum, Ainv, Aqk, h, vnew = ctx.saved_tensors
    if not ctx.save:
        raise RuntimeError("delta_chunk_fwd ran with save=False; call it with save=True to train")
    do = torch.zeros_like(v) if do is None else do.contiguous()
    dht = None if dht is None or dht.numel() == 0 else dht.contiguous()
    dq, dk, dv, dg, dbeta, dh0 = bwd(
        q, k, v, g, beta, h0, cu_seqlens, gcum, Ainv, Aqk, h, vnew, do, dht, ctx.gate, ctx.scale, *ctx.recipe
    )
    return dq, dk, dv, _none(dg), dbeta, _none(dh0)


def _backward(ctx, do, dht, *_):
    return (*_grads(ctx, do, dht, torch.ops.lt2dsl.delta_chunk_bwd), *[None] * 8)


delta_chunk_fwd.register_autograd(_backward, setup_context=_setup_context)


class _ChunkFunction(torch.autograd.Function):
    """Eager twin of the registered op's autograd: the same implementation without the custom-op
    dispatch (tens of µs of host time a call)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, cu_seqlens, gate, scale, want_final, *recipe):
        args = (q, k, v, g, beta, h0, cu_seqlens, gate, scale, want_final, True, *recipe)
        out = _chunk_fwd_impl(*args)
        _setup_context(ctx, args, out)
        return out[0], out[1]

    @staticmethod
    def backward(ctx, do, dht):
        return (*_grads(ctx, do, dht, _chunk_bwd_impl), *[None] * 7)


def _recurrent(q, k, v, g, beta, h0, ht, cu_seqlens, gate, scale, l2norm_qk, raw=None):
    """Launch the decode kernel; `ht` may be `h0` itself (in place) or None (no final state).
    `raw` = (A_log, dt_bias, row stride of g and beta, beta_scale) for gate 3, where g and beta
    are GDN's raw projections a and b (`recurrent.py`)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = _n_states(q, cu_seqlens)
    o = empty(v, *v.shape)
    BK, BV = pow2(K), min(32, pow2(V))
    A_log, dt_bias, s_ab, beta_scale = raw if raw is not None else (beta, beta, HV, 1.0)
    delta_recurrent_kernel[(triton.cdiv(V, BV), N * HV)](
        q,
        k,
        v,
        g if g is not None else beta,
        beta,
        h0 if h0 is not None else o,
        o,
        ht if ht is not None else o,
        cu_seqlens,
        T,
        scale,
        A_log,
        dt_bias,
        s_ab,
        beta_scale,
        H=H,
        HV=HV,
        K=K,
        V=V,
        BK=BK,
        BV=BV,
        GATE=gate,
        USE_H0=h0 is not None,
        STORE_FINAL=ht is not None,
        L2NORM=l2norm_qk,
        IS_VARLEN=cu_seqlens is not None,
        num_warps=8 if BK > 128 else 4,
    )
    return o


def _recurrent_impl(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, h0: Tensor | None,
    cu_seqlens: Tensor | None, gate: int, scale: float, want_final: bool, l2norm_qk: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    N, HV, K, V = _n_states(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]
    ht = empty(q, N, HV, K, V, dtype=torch.float32) if want_final else None
    o = _recurrent(q, k, v, g, beta, h0, ht, cu_seqlens, gate, scale, l2norm_qk)
    return o, (ht if ht is not None else q.new_empty(0))


delta_recurrent = custom_op("lt2dsl::delta_recurrent", _recurrent_impl, mutates_args=())


@delta_recurrent.register_fake
def _(q, k, v, g, beta, h0, cu_seqlens, gate, scale, want_final, l2norm_qk):
    N, HV, K, V = _n_states(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]
    shape = (N, HV, K, V) if want_final else (0,)
    return torch.empty_like(v), q.new_empty(shape, dtype=torch.float32)


def _recurrent_inplace_impl(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, state: Tensor, cu_seqlens: Tensor | None,
    gate: int, scale: float, l2norm_qk: bool,
) -> Tensor:  # fmt: skip
    return _recurrent(q, k, v, g, beta, state, state, cu_seqlens, gate, scale, l2norm_qk)


delta_recurrent_inplace = custom_op(
    "lt2dsl::delta_recurrent_inplace", _recurrent_inplace_impl, mutates_args=("state",)
)


@delta_recurrent_inplace.register_fake
def _(q, k, v, g, beta, state, cu_seqlens, gate, scale, l2norm_qk):
    return torch.empty_like(v)


def chunk_flops(B: int, T: int, HV: int, K: int, V: int) -> int:
    """Forward FLOPs of the chunked form: per token and value head 6CK + 4CV + C²/3 + 6KV (§4 (d))."""
    return B * T * HV * (6 * BT * K + 4 * BT * V + BT * BT // 3 + 6 * K * V)


@register_flop_formula(torch.ops.lt2dsl.delta_chunk_fwd)
def _chunk_fwd_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    B, T, _, K = q_shape
    return chunk_flops(B, T, v_shape[2], K, v_shape[3])


def chunk_bwd_flops(B: int, T: int, HV: int, K: int, V: int) -> int:
    """Backward matmul FLOPs of our kernels: the reverse scan 2(2CK + 2CV + 6KV) and the per-chunk
    gradients 2(6CK + 4CV + 6KV), per token and value head (recomputed products included)."""
    return B * T * HV * (16 * BT * K + 12 * BT * V + 24 * K * V)


@register_flop_formula(torch.ops.lt2dsl.delta_chunk_bwd)
def _chunk_bwd_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    B, T, _, K = q_shape
    return chunk_bwd_flops(B, T, v_shape[2], K, v_shape[3])


@register_flop_formula([torch.ops.lt2dsl.delta_recurrent, torch.ops.lt2dsl.delta_recurrent_inplace])
def _recurrent_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    """Decode: 7KV per token and value head (decay, Sᵀk, rank-1 update, Sᵀq; mixers.md §5 (d))."""
    B, T, _, K = q_shape
    return 7 * B * T * v_shape[2] * K * v_shape[3]


def delta_triton(
    gate, q, k, v, g, beta, scale, initial_state, want_state, inplace, cu_seqlens, use_qk_l2norm, recipe=None
):
    """Triton backend of the public ops: the decode kernel for short inference calls, else chunks
    in the forms of `recipe` (a `DeltaRecipe`, a name of `recipe.RECIPES`; None: the default)."""
    if k.shape[-1] > 256:
        raise ValueError(f"the Triton kernels support head dims K ≤ 256, got K={k.shape[-1]}")
    gid = GATES.index(gate)
    tensors = (q, k, v, g, beta, initial_state)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    if g is not None and g.dtype != torch.float32:
        g = g.float()
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    g = g.contiguous() if g is not None else None
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    shape = DeltaShape(gate, N, v.shape[2], k.shape[-1], v.shape[-1])
    if not needs_grad and q.shape[1] <= RECURRENT_MAX_T:
        if recipe is not None:  # checked although decode runs no chunk kernel
            resolve_recipe(recipe, shape, q.dtype, q.device)
        return _decode(
            gid, q, k, v, g, beta, scale, initial_state, want_state, inplace, cu_seqlens, use_qk_l2norm
        )
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    h0 = initial_state.contiguous() if initial_state is not None else None
    fields = astuple(resolve_recipe(recipe, shape, q.dtype, q.device))
    args = (q, k, v, g, beta, h0, cu_seqlens, gid, scale, want_state)
    if dispatch_needed((), {}):  # torch.compile, a dispatch mode, autocast
        o, ht, *_ = delta_chunk_fwd.op(*args, needs_grad, *fields)
    elif needs_grad:
        o, ht = _ChunkFunction.apply(*args, *fields)
    else:
        o, ht, *_ = _chunk_fwd_impl(*args, False, *fields)
    if inplace:
        with torch.no_grad():
            initial_state.copy_(ht)
        ht = initial_state
    return o, (ht if want_state else None)


def _decode(gid, q, k, v, g, beta, scale, initial_state, want_state, inplace, cu_seqlens, l2n):
    """Decode kernel (eager calls skip the custom-op dispatch: `custom_op.EagerOp`)."""
    if inplace and initial_state.dtype == torch.float32 and initial_state.is_contiguous():
        o = delta_recurrent_inplace(q, k, v, g, beta, initial_state, cu_seqlens, gid, scale, l2n)
        return o, initial_state
    h0 = initial_state.contiguous() if initial_state is not None else None
    o, ht = delta_recurrent(q, k, v, g, beta, h0, cu_seqlens, gid, scale, want_state, l2n)
    if inplace:
        initial_state.copy_(ht)
        ht = initial_state
    return o, (ht if want_state else None)
