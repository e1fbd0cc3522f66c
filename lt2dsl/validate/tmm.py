"""Toeplitz mixer options (`tmm`) that the shape rules of shapes.py do not cover."""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic
from lt2dsl.validate.context import ShapeCtx
from lt2dsl.validate.rules import rule
from lt2dsl.validate.shapes import constraint_errors


@rule("E0512")
def check_tmm_kernel(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Toeplitz kernel with more taps than the model has channels.

    What it checks:
        For `tmm`: `kernel <= dim`.

    Why it matters:
        With `kernel = k`, output channel c mixes the input channels c − k + 1 … c; the model
        has `dim` channels, so taps past them would only ever read zeros, and the kernels shift
        the channels by at most `dim − 1`.

    Example:
        dim = 8
        max_len = 64
        tmm(kernel=16)

    Use instead:
        dim = 8
        max_len = 64
        tmm(kernel=8)
    """
    yield from constraint_errors(s, "E0512")
