"""`torch.library` custom ops of the fused Triton kernels (namespace `lt2dsl`, prefix `fused_`).

Every forward op has a fake implementation and a registered autograd whose backward is itself a
custom op (so `torch.compile(fullgraph=True)` traces forward and backward through opaque nodes),
and the ops that contain a GEMM or a convolution carry a FLOP formula for `FlopCounterMode`.
The ops take and return plain tensors; the public functions in `lt2dsl.kernels.fused` choose
between them and the references.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import register_flop_formula

from lt2dsl.kernels.common.custom_op import custom_op

from . import triton_act, triton_conv, triton_conv_step, triton_norm, triton_rope

Tensor = torch.Tensor


def _like(t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    return torch.empty(t.shape, dtype=t.dtype if dtype is None else dtype, device=t.device)


# ---- add + RMSNorm ------------------------------------------------------------------------------


@custom_op("lt2dsl::fused_add_rmsnorm", mutates_args=())
def add_rmsnorm_op(x: Tensor, r: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(RMSNorm(x + r) · γ, x + r, rstd `[M]` fp32)."""
    return triton_norm.add_rmsnorm_fwd(x, r, weight, eps)


@add_rmsnorm_op.register_fake
def _(x, r, weight, eps):
    M = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return _like(x), _like(x), x.new_empty(M, dtype=torch.float32)


@custom_op("lt2dsl::fused_add_rmsnorm_bwd", mutates_args=())
def add_rmsnorm_bwd_op(
    dn: Tensor, ds: Tensor | None, s: Tensor, weight: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor]:
    """(dx = dr, dγ)."""
    return triton_norm.add_rmsnorm_bwd(dn, ds, s, weight, rstd)


@add_rmsnorm_bwd_op.register_fake
def _(dn, ds, s, weight, rstd):
    return _like(s), _like(weight)


def _add_rmsnorm_setup(ctx, inputs, output):
    _, _, weight, _ = inputs
    _, s, rstd = output
    ctx.save_for_backward(s, weight, rstd)
    ctx.mark_non_differentiable(rstd)
    ctx.set_materialize_grads(False)


def _add_rmsnorm_backward(ctx, dn, ds, _drstd):
    s, weight, rstd = ctx.saved_tensors
    if dn is None:
        dn = torch.zeros_like(s)
    dx, dw = torch.ops.lt2dsl.fused_add_rmsnorm_bwd(dn, ds, s, weight, rstd)
    return dx, dx, dw, None


add_rmsnorm_op.register_autograd(_add_rmsnorm_backward, setup_context=_add_rmsnorm_setup)


@custom_op("lt2dsl::fused_norm_add_rmsnorm", mutates_args=())
def norm_add_rmsnorm_op(
    x: Tensor, y: Tensor, w1: Tensor, eps1: float, w2: Tensor, eps2: float
) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + RMSNorm(y) · γ₁) · γ₂, x + RMSNorm(y) · γ₁); no autograd (inference)."""
    return triton_norm.norm_add_rmsnorm_fwd(x, y, w1, eps1, w2, eps2)


@norm_add_rmsnorm_op.register_fake
def _(x, y, w1, eps1, w2, eps2):
    return _like(x), _like(x)


# ---- gated RMSNorm + output projection ----------------------------------------------------------


@custom_op("lt2dsl::fused_gated_rmsnorm", mutates_args=())
def gated_rmsnorm_op(
    o2: Tensor, g2: Tensor | None, weight: Tensor, eps: float, act: int, group: int, norm_first: bool
) -> Tensor:
    """y `[M, L]` (weight's dtype) of o2, g2 `[M, L]`; no autograd: the linear op recomputes it."""
    return triton_norm.gated_rmsnorm_fwd(o2, g2, weight, eps, act, group, norm_first)


@gated_rmsnorm_op.register_fake
def _(o2, g2, weight, eps, act, group, norm_first):
    return _like(o2, weight.dtype).contiguous()


@custom_op("lt2dsl::fused_gated_rmsnorm_bwd", mutates_args=())
def gated_rmsnorm_bwd_op(
    dy: Tensor,
    o2: Tensor,
    g2: Tensor | None,
    weight: Tensor,
    eps: float,
    act: int,
    group: int,
    norm_first: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(do `[M, L]`, dg `[M, L]` (empty without a gate), dw `[dim]`)."""
    do, dg, dw = triton_norm.gated_rmsnorm_bwd(dy, o2, g2, weight, eps, act, group, norm_first)
    return do, (dg if dg is not None else o2.new_empty(0)), dw


@gated_rmsnorm_bwd_op.register_fake
def _(dy, o2, g2, weight, eps, act, group, norm_first):
    dg = _like(g2).contiguous() if g2 is not None else o2.new_empty(0)
    return _like(o2).contiguous(), dg, _like(weight)


@custom_op("lt2dsl::fused_gated_rmsnorm_linear", mutates_args=())
def gated_rmsnorm_linear_op(
    o2: Tensor,
    g2: Tensor | None,
    norm_weight: Tensor,
    proj_weight: Tensor,
    proj_bias: Tensor | None,
    eps: float,
    act: int,
    group: int,
    norm_first: bool,
) -> Tensor:
    """`F.linear(GatedRMSNorm(o2, g2), W, b)`: `[M, L]` → `[M, D]`; the normed tile is not kept."""
    y = triton_norm.gated_rmsnorm_fwd(o2, g2, norm_weight, eps, act, group, norm_first)
    return F.linear(y, proj_weight, proj_bias)


@gated_rmsnorm_linear_op.register_fake
def _(o2, g2, norm_weight, proj_weight, proj_bias, eps, act, group, norm_first):
    return o2.new_empty(o2.shape[0], proj_weight.shape[0], dtype=norm_weight.dtype)


def _gated_linear_setup(ctx, inputs, output):
    o2, g2, norm_weight, proj_weight, proj_bias, eps, act, group, norm_first = inputs
    ctx.save_for_backward(o2, g2, norm_weight, proj_weight)
    ctx.cfg = (eps, act, group, norm_first)
    ctx.has_bias = proj_bias is not None


def _gated_linear_backward(ctx, dout):
    o2, g2, norm_weight, proj_weight = ctx.saved_tensors
    eps, act, group, norm_first = ctx.cfg
    # recompute the normed activations instead of keeping them from the forward
    y = torch.ops.lt2dsl.fused_gated_rmsnorm(o2, g2, norm_weight, eps, act, group, norm_first)
    d_pw = dout.t().mm(y)
    d_pb = dout.sum(0) if ctx.has_bias else None
    dy = dout.mm(proj_weight)
    do, dg, dnw = torch.ops.lt2dsl.fused_gated_rmsnorm_bwd(
        dy, o2, g2, norm_weight, eps, act, group, norm_first
    )
    return do, (dg if g2 is not None else None), dnw, d_pw, d_pb, None, None, None, None


gated_rmsnorm_linear_op.register_autograd(_gated_linear_backward, setup_context=_gated_linear_setup)


@register_flop_formula(torch.ops.lt2dsl.fused_gated_rmsnorm_linear)
def _gated_linear_flops(o_shape, g_shape, nw_shape, pw_shape, *args, out_shape=None, **kwargs) -> int:
    """The output projection: 2 · M · L · D."""
    return 2 * o_shape[0] * pw_shape[1] * pw_shape[0]


# ---- short conv + SiLU (+ L2Norm) ---------------------------------------------------------------


@custom_op("lt2dsl::fused_conv_silu", mutates_args=())
def conv_silu_op(x: Tensor, w2: Tensor, bias: Tensor | None, hist: Tensor | None, head_dim: int) -> Tensor:
    """y `[B, T, C]` = [L2Norm_head](SiLU(causal depthwise conv(x) + b)), hist the W−1 inputs before x."""
    return triton_conv.conv_silu_fwd(x, w2, bias, hist, head_dim)


@conv_silu_op.register_fake
def _(x, w2, bias, hist, head_dim):
    return x.new_empty(x.shape)


@custom_op("lt2dsl::fused_conv_silu_bwd", mutates_args=())
def conv_silu_bwd_op(
    dy: Tensor, x: Tensor, w2: Tensor, bias: Tensor | None, hist: Tensor | None, head_dim: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx `[B, T, C]`, dw `[C, W]` fp32, db `[C]` fp32); the cached history gets no gradient."""
    return triton_conv.conv_silu_bwd(dy, x, w2, bias, hist, head_dim)


@conv_silu_bwd_op.register_fake
def _(dy, x, w2, bias, hist, head_dim):
    return (
        x.new_empty(x.shape),
        w2.new_empty(w2.shape, dtype=torch.float32),
        w2.new_empty(w2.shape[0], dtype=torch.float32),
    )


def _conv_setup(ctx, inputs, output):
    x, w2, bias, hist, head_dim = inputs
    ctx.save_for_backward(x, w2, bias, hist)
    ctx.head_dim = head_dim


def _conv_backward(ctx, dy):
    x, w2, bias, hist = ctx.saved_tensors
    dx, dw, db = torch.ops.lt2dsl.fused_conv_silu_bwd(dy, x, w2, bias, hist, ctx.head_dim)
    return dx, dw.to(w2.dtype), (db.to(bias.dtype) if bias is not None else None), None, None


conv_silu_op.register_autograd(_conv_backward, setup_context=_conv_setup)


@register_flop_formula(torch.ops.lt2dsl.fused_conv_silu)
def _conv_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """Depthwise conv as FlopCounterMode counts convolutions: 2 · B · T · C · W."""
    B, T, C = x_shape
    return 2 * B * T * C * w_shape[1]


@register_flop_formula(torch.ops.lt2dsl.fused_conv_silu_bwd)
def _conv_bwd_flops(dy_shape, x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """dx and dw: 2 · (2 · B · T · C · W)."""
    B, T, C = x_shape
    return 4 * B * T * C * w_shape[1]


# Histories and outputs are separate tensors, not lists: functionalization (torch.compile) takes
# an op that mutates tensors only if it returns plain tensors.
@custom_op("lt2dsl::fused_conv_silu_step", mutates_args=("h0", "h1", "h2"))
def conv_silu_step_op(
    xs: list[Tensor],
    w2s: list[Tensor],
    biases: list[Tensor | None],
    h0: Tensor,
    h1: Tensor | None,
    h2: Tensor | None,
    head_dims: list[int],
) -> tuple[Tensor, Tensor, Tensor]:
    """The decode step of up to three short convs, one launch: (y_0, y_1, y_2) `[B, C_i]` (empty
    past the last x); the histories h_i (one per x, None past them) shifted in place."""
    hists = [h for h in (h0, h1, h2) if h is not None]
    ys = triton_conv_step.conv_silu_step_fwd(xs, w2s, biases, hists, head_dims)
    return tuple(ys + [xs[0].new_empty(0) for _ in range(3 - len(ys))])


@conv_silu_step_op.register_fake
def _(xs, w2s, biases, h0, h1, h2, head_dims):
    return tuple([x.new_empty(x.shape) for x in xs] + [xs[0].new_empty(0) for _ in range(3 - len(xs))])


@register_flop_formula(torch.ops.lt2dsl.fused_conv_silu_step)
def _conv_step_flops(xs_shapes, w_shapes, *args, out_shape=None, **kwargs) -> int:
    """Depthwise convs as FlopCounterMode counts convolutions: Σ_i 2 · B · C_i · W."""
    return sum(2 * x[0] * x[1] * w[1] for x, w in zip(xs_shapes, w_shapes))


# ---- RoPE ---------------------------------------------------------------------------------------


@custom_op("lt2dsl::fused_rope", mutates_args=())
def rope_op(x0: Tensor, x1: Tensor | None, c: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    """RoPE of x0 (and x1) `[B, T, H_i, D]` by the table rows c, s `[B or 1, T, R]`, one launch; no
    autograd (inference). (y0, y1), y1 empty without x1."""
    ys = triton_rope.rope_fwd([x0] if x1 is None else [x0, x1], c, s)
    return ys[0], (ys[1] if x1 is not None else x0.new_empty(0))


@rope_op.register_fake
def _(x0, x1, c, s):
    return x0.new_empty(x0.shape), (x1.new_empty(x1.shape) if x1 is not None else x0.new_empty(0))


@custom_op("lt2dsl::fused_rope_cache", mutates_args=("k_cache", "v_cache"))
def rope_cache_op(
    q: Tensor, k: Tensor, v: Tensor | None, c: Tensor, s: Tensor, k_cache: Tensor, v_cache: Tensor | None,
    positions: Tensor, ring: bool, weight: Tensor | None, bias: Tensor | None, eps: float,
) -> Tensor:  # fmt: skip
    """RoPE of q; k (LayerNorm-ed with a weight) turned and v copied into their caches at each
    row's slot, one launch; no autograd (inference)."""
    norm = (weight, bias, eps) if weight is not None else None
    return triton_rope.rope_cache_fwd(q, k, v, c, s, k_cache, v_cache, positions, ring, norm)


@rope_cache_op.register_fake
def _(q, k, v, c, s, k_cache, v_cache, positions, ring, weight, bias, eps):
    return q.new_empty(q.shape)


@custom_op("lt2dsl::fused_xpos", mutates_args=())
def xpos_op(
    x0: Tensor, x1: Tensor | None, cos: Tensor, sin: Tensor, positions: Tensor
) -> tuple[Tensor, Tensor]:
    """RetNet's pair rotation of x0 (and x1) `[B, T, H_i, D]` at table rows `positions`, one launch;
    no autograd (inference). (y0, y1), y1 empty without x1."""
    ys = triton_rope.xpos_fwd([x0] if x1 is None else [x0, x1], cos, sin, positions)
    return ys[0], (ys[1] if x1 is not None else x0.new_empty(0))


@xpos_op.register_fake
def _(x0, x1, cos, sin, positions):
    return x0.new_empty(x0.shape), (x1.new_empty(x1.shape) if x1 is not None else x0.new_empty(0))


# ---- GDN gates ----------------------------------------------------------------------------------


@custom_op("lt2dsl::fused_gdn_gate", mutates_args=())
def gdn_gate_op(
    a2: Tensor, b2: Tensor, A_log: Tensor, dt_bias: Tensor, beta_scale: float
) -> tuple[Tensor, Tensor]:
    """g = −exp(A_log) · softplus(a + dt_bias), β = s · σ(b): `[M, HV]` fp32 each."""
    return triton_act.gdn_gate_fwd(a2, b2, A_log, dt_bias, beta_scale)


@gdn_gate_op.register_fake
def _(a2, b2, A_log, dt_bias, beta_scale):
    return _like(a2, torch.float32).contiguous(), _like(a2, torch.float32).contiguous()


@custom_op("lt2dsl::fused_gdn_gate_bwd", mutates_args=())
def gdn_gate_bwd_op(
    dg: Tensor, dbeta: Tensor, a2: Tensor, b2: Tensor, A_log: Tensor, dt_bias: Tensor, beta_scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(da, db, dA_log, d dt_bias)."""
    return triton_act.gdn_gate_bwd(dg, dbeta, a2, b2, A_log, dt_bias, beta_scale)


@gdn_gate_bwd_op.register_fake
def _(dg, dbeta, a2, b2, A_log, dt_bias, beta_scale):
    return _like(a2).contiguous(), _like(b2).contiguous(), _like(A_log), _like(dt_bias)


def _gate_setup(ctx, inputs, output):
    a2, b2, A_log, dt_bias, beta_scale = inputs
    ctx.save_for_backward(a2, b2, A_log, dt_bias)
    ctx.beta_scale = beta_scale
    ctx.set_materialize_grads(False)


def _gate_backward(ctx, dg, dbeta):
    a2, b2, A_log, dt_bias = ctx.saved_tensors
    dg = torch.zeros(a2.shape, dtype=torch.float32, device=a2.device) if dg is None else dg
    dbeta = torch.zeros(b2.shape, dtype=torch.float32, device=b2.device) if dbeta is None else dbeta
    da, db, dA, ddt = torch.ops.lt2dsl.fused_gdn_gate_bwd(dg, dbeta, a2, b2, A_log, dt_bias, ctx.beta_scale)
    return da, db, dA, ddt, None


gdn_gate_op.register_autograd(_gate_backward, setup_context=_gate_setup)


# ---- Mamba2 gates -------------------------------------------------------------------------------


@custom_op("lt2dsl::fused_mamba2_gate", mutates_args=())
def mamba2_gate_op(a2: Tensor, x3: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """Mamba2's v = dt · x `[M, H, P]` (x's dtype) and g = −exp(A_log) · dt `[M, H]` fp32 with
    dt = softplus(a + dt_bias), one launch; no autograd (inference)."""
    return triton_act.mamba2_gate_fwd(a2, x3, A_log, dt_bias)


@mamba2_gate_op.register_fake
def _(a2, x3, A_log, dt_bias):
    return x3.new_empty(x3.shape), a2.new_empty(a2.shape, dtype=torch.float32)


# ---- SwiGLU -------------------------------------------------------------------------------------


@custom_op("lt2dsl::fused_swiglu", mutates_args=())
def swiglu_op(a2: Tensor, b2: Tensor) -> Tensor:
    """SiLU(a) ⊙ b over `[M, F]`."""
    return triton_act.swiglu_fwd(a2, b2)


@swiglu_op.register_fake
def _(a2, b2):
    return _like(a2).contiguous()


@custom_op("lt2dsl::fused_swiglu_bwd", mutates_args=())
def swiglu_bwd_op(dy: Tensor, a2: Tensor, b2: Tensor) -> tuple[Tensor, Tensor]:
    """(da, db)."""
    return triton_act.swiglu_bwd(dy, a2, b2)


@swiglu_bwd_op.register_fake
def _(dy, a2, b2):
    return _like(a2).contiguous(), _like(b2).contiguous()


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, dy):
    a2, b2 = ctx.saved_tensors
    return torch.ops.lt2dsl.fused_swiglu_bwd(dy, a2, b2)


swiglu_op.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)
