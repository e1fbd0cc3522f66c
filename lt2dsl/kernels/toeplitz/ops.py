"""torch.library registration of the fast Toeplitz path (cuFFT + fused Triton passes) and its decode.

`lt2dsl::toeplitz_fft` / `lt2dsl::toeplitz_fft_bwd` are tied by `register_autograd`;
`lt2dsl::toeplitz_step` is the decode step. Each has a fake implementation and a FLOP formula.
"""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import register_flop_formula

from lt2dsl.kernels.common.custom_op import custom_op

from .decode import toeplitz_step_triton
from .fft_fast import toeplitz_fft_bwd, toeplitz_fft_fwd
from .fft_ref import fft_size

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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


def check_dtype(x: torch.Tensor) -> None:
    if x.dtype not in TRITON_DTYPES:
        raise ValueError(f"backend='triton' supports {TRITON_DTYPES}, got {x.dtype}; use backend='reference'")
