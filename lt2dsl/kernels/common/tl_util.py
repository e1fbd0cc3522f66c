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
