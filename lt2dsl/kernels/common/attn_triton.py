"""Triton helpers shared by the attention-family kernels."""

from __future__ import annotations

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


@triton.jit
def rows_ptr(ptr, off, STRIDE, offs):
    """`[R, B?]` pointers to columns `offs` of rows `off` (`[R]`, STRIDE elements apart)."""
    return ptr + off[:, None] * STRIDE + offs[None, :]


@triton.jit
def rows_mask(in_rows, offs, WIDTH: tl.constexpr):
    """`[R, B?]`: the row is in range (`in_rows`) and the column below WIDTH."""
    return in_rows[:, None] & (offs[None, :] < WIDTH)


@triton.jit
def load_rows(ptr, off, STRIDE, in_rows, offs, WIDTH: tl.constexpr):
    """The tile of `rows_ptr`, zero outside `rows_mask`. A store writes
    `tl.store(rows_ptr(...), value, mask=rows_mask(...))`, which computes the value between the
    pointers and the mask, as a store written out in full does."""
    return tl.load(rows_ptr(ptr, off, STRIDE, offs), mask=rows_mask(in_rows, offs, WIDTH), other=0.0)


@triton.jit
def softmax_init(BR: tl.constexpr, BV: tl.constexpr, START: tl.constexpr):
    """(acc `[BR, BV]`, running max `[BR]` from START, running sum `[BR]`) of an online softmax."""
    acc = tl.zeros([BR, BV], dtype=tl.float32)
    m_i = tl.full([BR], START, dtype=tl.float32)
    l_i = tl.zeros([BR], dtype=tl.float32)
    return acc, m_i, l_i


@triton.jit
def softmax_step(s, m_i, l_i):
    """(new running max, rescale factor of the old terms, p = exp2(s − max), new running sum) of
    scores s `[BR, BN]` in log2 units."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    return m_new, alpha, p, l_i


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


def head_constexprs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """The head constexprs of an attention kernel for q `[B, Tq, HQ, D]`, k `[B, Tk, HKV, D]` and
    v `[B, Tk, HKV, DV]`: HQ, GRP = HQ // HKV, D, DV and their tile widths BD, BDV."""
    HQ, D, HKV, DV = q.shape[2], q.shape[3], k.shape[2], v.shape[3]
    return dict(HQ=HQ, GRP=HQ // HKV, D=D, DV=DV, BD=pow2(D), BDV=pow2(DV))
