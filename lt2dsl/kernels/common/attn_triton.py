"""Triton helpers shared by the attention-family kernels."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .backend import triton_interpreting


@triton.jit
def mm(a, b, DOT_PREC: tl.constexpr):
    """tl.dot with the precision policy of `dot_precision` ("upcast": fp32 operands, interpreter only)."""
    if DOT_PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=DOT_PREC)


def dot_precision(dtype: torch.dtype) -> str:
    """Dot policy for an input dtype.

    fp32 inputs must not be rounded to tf32 (the 1e-4 accuracy target): "ieee". 16-bit inputs use the
    tensor cores as they are ("tf32" is ignored for them). Under TRITON_INTERPRET the bf16 `tl.dot`
    of Triton 3.9's interpreter returns garbage, so its operands are upcast there ("upcast"); the
    loads, stores and casts still run in bf16.
    """
    if dtype == torch.float32:
        return "ieee"
    return "upcast" if triton_interpreting() else "tf32"


def pow2(n: int) -> int:
    """Tile width for a head dim: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(n))


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Give Triton a global-scratch allocator if none is set: kernels that build tensor descriptors
    in the kernel (`tl.make_tensor_descriptor`) write their TMA descriptors there.

    Called at each launch, not once: the allocator is a ContextVar, and autograd runs backward
    kernels on its own device threads, which start from the default (null) allocator.
    """
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def tma_eligible(*ts: torch.Tensor) -> bool:
    """Can the attention kernels read these `[B, T, H, D]` tensors through TMA descriptors?

    The descriptors are built per (sequence, head) on a base pointer and a row stride of H·D
    elements: both must be 16-byte aligned, and the head dim a multiple of 16 bytes. Off by
    default until the H200 timing decides (`LT2_ATTN_TMA=1`); the interpreter runs the same code.
    """
    if os.environ.get("LT2_ATTN_TMA", "0") != "1":
        return False
    on_gpu = not triton_interpreting()
    if on_gpu and (not all(t.is_cuda for t in ts) or torch.cuda.get_device_capability(ts[0].device)[0] < 9):
        return False
    for t in ts:
        es = t.element_size()
        if t.stride(-1) != 1 or (t.shape[-1] * es) % 16 or t.data_ptr() % 16 or (t.stride(-3) * es) % 16:
            return False
    return True
