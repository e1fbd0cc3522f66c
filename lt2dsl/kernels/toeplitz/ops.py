"""torch.library registration of the fast Toeplitz paths and the decode step.

`lt2dsl::toeplitz_fft` / `lt2dsl::toeplitz_fft_bwd` (cuFFT in fp32 with fused Triton passes, any
float dtype, every variant) and `lt2dsl::toeplitz_blocked` / `lt2dsl::toeplitz_blocked_bwd`
(blocked DFTs on tensor cores, 16-bit inputs, kernel size 1) are each tied by `register_autograd`;
`lt2dsl::toeplitz_step` is the decode step. Each has a fake implementation and a FLOP formula. The
blocked ops take the name of a `recipe.RECIPES` entry ("" for the default of the call's shape).
"""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import register_flop_formula

from lt2dsl.kernels.common.custom_op import custom_op

from .blocked import blocked_bwd, blocked_fwd
from .decode import toeplitz_step_triton
from .fft_fast import toeplitz_fft_bwd, toeplitz_fft_fwd
from .fft_ref import fft_size
from .recipe import pick


@custom_op("lt2dsl::toeplitz_fft", mutates_args=())
def toeplitz_fft(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y `[B, T, C]` for w `[kernel, heads, n]` and bias `[heads, n]` (or None)."""
    return toeplitz_fft_fwd(x, w, bias)


@toeplitz_fft.register_fake
def _(x, w, bias):
    return torch.empty_like(x)


@custom_op("lt2dsl::toeplitz_fft_bwd", mutates_args=())
def toeplitz_fft_bwd_op(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db); db is an empty tensor without bias."""
    dx, dw, db = toeplitz_fft_bwd(dy, x, w, has_bias)
    return dx, dw, db if db is not None else x.new_empty(0, dtype=torch.float32)


@toeplitz_fft_bwd_op.register_fake
def _(dy, x, w, has_bias):
    f32 = torch.float32
    db = x.new_empty(w.shape[1], w.shape[2], dtype=f32) if has_bias else x.new_empty(0, dtype=f32)
    return torch.empty_like(x), torch.empty_like(w, dtype=f32), db


def _setup_context(ctx, inputs, output):
    x, w, bias = inputs
    ctx.save_for_backward(x, w)
    ctx.has_bias = bias is not None
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, dy):
    x, w = ctx.saved_tensors
    dx, dw, db = torch.ops.lt2dsl.toeplitz_fft_bwd(dy.contiguous(), x, w, ctx.has_bias)
    return dx, dw.to(w.dtype), db.to(ctx.bias_dtype) if ctx.has_bias else None


torch.library.register_autograd("lt2dsl::toeplitz_fft", _backward, setup_context=_setup_context)


def fft_flops(x_shape) -> int:
    """≈ (10·log2(N) + 6) per channel and token (mixers.md §13(d): two real FFTs + complex product)."""
    B, T, C = x_shape
    return int(B * T * C * (10 * math.log2(fft_size(T)) + 6))


@register_flop_formula(torch.ops.lt2dsl.toeplitz_fft)
def _fwd_flops(x_shape, *args, out_shape=None, **kwargs) -> int:
    return fft_flops(x_shape)


@register_flop_formula(torch.ops.lt2dsl.toeplitz_fft_bwd)
def _bwd_flops(dy_shape, *args, out_shape=None, **kwargs) -> int:
    # three transforms of activations and two products: ≈ 2× forward
    return 2 * fft_flops(dy_shape)


@custom_op("lt2dsl::toeplitz_blocked", mutates_args=())
def toeplitz_blocked(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, block: int, recipe: str
) -> torch.Tensor:
    """y `[B, T, C]` for 16-bit x, w `[heads, n]`, bias `[heads, n]` (or None), time blocks of `block`."""
    return blocked_fwd(x, w, bias, block, pick(recipe, w.shape[0], x.shape[1], block))


@toeplitz_blocked.register_fake
def _(x, w, bias, block, recipe):
    return torch.empty_like(x)


@custom_op("lt2dsl::toeplitz_blocked_bwd", mutates_args=())
def toeplitz_blocked_bwd_op(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, has_bias: bool, block: int, recipe: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db); db is an empty tensor without bias."""
    dx, dw, db = blocked_bwd(dy, x, w, has_bias, block, pick(recipe, w.shape[0], x.shape[1], block))
    return dx, dw, db if db is not None else x.new_empty(0, dtype=torch.float32)


@toeplitz_blocked_bwd_op.register_fake
def _(dy, x, w, has_bias, block, recipe):
    f32 = torch.float32
    db = x.new_empty(w.shape[0], w.shape[1], dtype=f32) if has_bias else x.new_empty(0, dtype=f32)
    return torch.empty_like(x), torch.empty_like(w, dtype=f32), db


def _setup_blocked(ctx, inputs, output):
    x, w, bias, block, recipe = inputs
    ctx.save_for_backward(x, w)
    ctx.has_bias, ctx.block, ctx.recipe = bias is not None, block, recipe
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward_blocked(ctx, dy, bwd=None):
    x, w = ctx.saved_tensors
    bwd = bwd or torch.ops.lt2dsl.toeplitz_blocked_bwd
    dx, dw, db = bwd(dy.contiguous(), x, w, ctx.has_bias, ctx.block, ctx.recipe)
    return dx, dw.to(w.dtype), db.to(ctx.bias_dtype) if ctx.has_bias else None, None, None


torch.library.register_autograd("lt2dsl::toeplitz_blocked", _backward_blocked, setup_context=_setup_blocked)


class BlockedFunction(torch.autograd.Function):
    """`lt2dsl::toeplitz_blocked` as a plain autograd.Function (same setup and backward), for eager
    calls that autograd records: the registered op's dispatch costs ~80 µs of host time a call
    (measured on the H200), and the op is host-bound at the benchmark shape."""

    @staticmethod
    def forward(ctx, x, w, bias, block, recipe):
        _setup_blocked(ctx, (x, w, bias, block, recipe), None)
        return toeplitz_blocked.impl(x, w, bias, block, recipe)

    @staticmethod
    def backward(ctx, dy):
        return _backward_blocked(ctx, dy, bwd=toeplitz_blocked_bwd_op.impl)


def blocked_flops(x_shape, block: int, backward: bool = False) -> int:
    """Multiply-adds ×2 the tensor cores run: per channel and token 4S for each block DFT pass and
    ≈ 4(M + 1) for the causal block-axis products (their diagonal tiles in full); the backward has
    three DFT passes, the anti-causal products and the spectra's correlations (4M)."""
    B, T, C = x_shape
    M = -(-T // block)
    per = 12 * block + 8 * (M + 1) if backward else 8 * block + 4 * (M + 1)
    return int(B * M * block * C * per)


@register_flop_formula(torch.ops.lt2dsl.toeplitz_blocked)
def _blocked_flops(x_shape, w_shape, bias_shape, block, *args, out_shape=None, **kwargs) -> int:
    return blocked_flops(x_shape, block)


@register_flop_formula(torch.ops.lt2dsl.toeplitz_blocked_bwd)
def _blocked_bwd_flops(dy_shape, x_shape, w_shape, has_bias, block, *args, out_shape=None, **kwargs) -> int:
    return blocked_flops(dy_shape, block, backward=True)


@custom_op("lt2dsl::toeplitz_step", mutates_args=())
def toeplitz_step(x_cache: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y_t `[B, C]` from the cached inputs `[B, t, C]`."""
    return toeplitz_step_triton(x_cache, w, bias)


@toeplitz_step.register_fake
def _(x_cache, w, bias):
    return x_cache.new_empty(x_cache.shape[0], x_cache.shape[2])


@register_flop_formula(torch.ops.lt2dsl.toeplitz_step)
def _step_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """2·t·kernel per channel (mixers.md §13(c))."""
    B, t, C = x_shape
    return 2 * B * t * C * w_shape[0]
