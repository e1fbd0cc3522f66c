"""RoPE options (E052x) of `full` / `swa`: what the rotation and its scaling need to be defined."""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic
from lt2dsl.validate.context import ShapeCtx
from lt2dsl.validate.rules import rule
from lt2dsl.validate.shapes import constraint_errors


@rule("E0520")
def check_rope_dim(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Partial RoPE over an odd number of dims, or over more dims than a head has.

    What it checks:
        For `full` and `swa`: `rope_dim` is even and at most `head_dim`.

    Why it matters:
        RoPE rotates pairs of dims (d_i, d_{i + rope_dim/2}) of the first `rope_dim` dims of each
        head; an odd count leaves a dim without a partner, and a head has only `head_dim` dims.

    Example:
        dim = 512
        full(head_dim=64, rope_dim=96)

    Use instead:
        dim = 512
        full(head_dim=64, rope_dim=32)
    """
    yield from constraint_errors(s, "E0520")


@rule("E0521")
def check_rope_freq_factors(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Llama 3 RoPE scaling whose high-frequency factor is not above its low-frequency factor.

    What it checks:
        For `rope_scaling=llama3`: `rope_high_freq > rope_low_freq`.

    Why it matters:
        Llama 3 scaling interpolates between the two wavelengths `original / low` and
        `original / high`; with equal factors the interpolation divides by zero.

    Example:
        dim = 512
        full(rope_scaling=llama3, rope_factor=8, rope_low_freq=4, rope_high_freq=4)

    Use instead:
        dim = 512
        full(rope_scaling=llama3, rope_factor=8, rope_low_freq=1, rope_high_freq=4)
    """
    yield from constraint_errors(s, "E0521")
