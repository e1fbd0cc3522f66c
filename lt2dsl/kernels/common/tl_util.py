"""Triton device helpers shared by every kernel family."""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.backend import triton_interpreting

# Triton's CPU interpreter casts fp32 to bf16 by truncation (twice the GPU's rounding error, and
# biased); `cast` rounds to nearest even there, so the CPU tests see the GPU's precision.
INTERP = tl.constexpr(triton_interpreting())
# The default of a helper's cache-modifier parameter (no modifier). A constexpr parameter's default
# must be a `tl.constexpr`: Triton 3.6 (the GPU's) fails on a plain Python one such as "" ("'str'
# object has no attribute 'type'"), which Triton 3.9's interpreter accepts.
NO_CACHE_MODIFIER = tl.constexpr("")


def helper(fn):
    """`triton.jit` for device helpers called from kernels.

    Under TRITON_INTERPRET=1 Triton re-patches `triton.language` on every helper call (≈2 ms each,
    most of the CPU test time); the kernel launch has patched it already, so the helper here runs
    its rewritten Python directly. Compiled (GPU) code is unaffected.
    """
    jitted = triton.jit(fn)
    if not triton_interpreting() or not hasattr(jitted, "rewrite"):
        return jitted

    class _Helper(type(jitted)):
        def __call__(self, *args, **kwargs):
            return self.rewrite()(*args, **kwargs)

    jitted.__class__ = _Helper
    return jitted


@helper
def cast(x, DT: tl.constexpr):
    """x.to(DT), rounding to nearest even under the interpreter too (see INTERP)."""
    if INTERP and tl.bfloat16 == DT:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = bits.to(tl.float32, bitcast=True).to(DT)
    else:
        out = x.to(DT)
    return out


# Largest decay Σ −g over a 16-token sub-chunk (max over channels) for which the per-channel-decay
# kernels (GLA, KDA) form its diagonal block as a dot through the sub-chunk's start: the key factor
# K ⊙ e^{c − b} then stays ≤ e^{span}, inside the fp32 / bf16 range of the dot operands.
DIAG_SPAN = 40.0


def diag_span(fp16_operands: bool, limit: float = DIAG_SPAN) -> float:
    """`limit`, capped at e^8 when the dot operands are fp16 (which holds e^11 at most: room for
    |k| up to ~20)."""
    return min(limit, 8.0) if fp16_operands else limit


@helper
def head_split(i_nh, H: tl.constexpr, HV: tl.constexpr):
    """(row, value head, q/k head) of a flat program index i_nh = row * HV + value head, the row
    being a sequence or a batch row; value head j reads q/k head j // (HV // H)."""
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    return i_n, i_hv, i_h


@helper
def tile_head_program(H: tl.constexpr, HV: tl.constexpr):
    """(i_v, i_nh, `head_split` of i_nh) of a program over (V tile i_v, row x value head i_nh)."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv, i_h = head_split(i_nh, H, HV)
    return i_v, i_nh, i_n, i_hv, i_h


@helper
def kv_channels(i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """(key channels `[BK]` from 0, value channels `[BV]` of V tile i_v, their masks < K and < V)
    of a program holding a `[BK, BV]` slice of a `[K, V]` state."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    return o_k, o_v, o_k < K, o_v < V
