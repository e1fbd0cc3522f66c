"""lt2dsl's size limits: a program inside them lowers, and runs wherever its weights fit.

Validation reports a value past its limit (E0204) and a model that applies too many blocks
(E0205) with the limit in the help line; the lowering asserts the same two predicates for a
resolved `Model` built in Python. The limits are far above any published model (the widest
dense model has d_model 25,600; the largest vocabularies ~256k; Huginn runs 4 blocks for up to
132 iterations), so they only catch typos and generated nonsense: a 31-digit `dim`, a loop of
10^30 iterations, 63 nested loops of 2 (2^63 applications).
"""

from __future__ import annotations

from lt2dsl.ir.spec import Option

# Widths and counts (`dim`, `heads`, `head_dim`, `state`, `conv`, …): every projection stays
# below 2^48 elements, so shapes, byte counts and index arithmetic fit in 64 bits.
MAX_WIDTH = 1 << 16
# Lengths and sizes written with `k`/`M` (`max_len`, `window`, `topk`, `hidden`, blocks).
MAX_SIZE = 1 << 24
# Per option name, where a width or size limit does not fit.
MAX_BY_NAME = {"vocab": 1 << 24}
# Block applications (the effective depth): the lowering unrolls every loop iteration into the
# traced graph, ~10 ms and ~10 graph nodes per application, so 2048 traces in ~20 s.
MAX_APPLIED = 2048


def max_value(o: Option) -> int | None:
    """The largest value lt2dsl accepts for an integer option, None for other types."""
    if o.name in MAX_BY_NAME:
        return MAX_BY_NAME[o.name]
    return {"int": MAX_WIDTH, "size": MAX_SIZE}.get(o.type)


def depth_problem(applied: int) -> str | None:
    """None when a model applying `applied` blocks is within the limit, else the message."""
    if applied <= MAX_APPLIED:
        return None
    # float() and str() of a count with thousands of digits would raise: say its power of two
    bits = applied.bit_length()
    if bits <= 40:
        count = f"{applied:,}"
    else:
        count = f"about {float(applied):.1e}" if bits < 1000 else f"about 2^{bits - 1}"
    return f"the model applies {count} blocks (effective depth), more than lt2dsl's {MAX_APPLIED:,}"
