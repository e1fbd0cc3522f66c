"""Kernel constraints (W04xx): warnings that say when a block will run on the reference path.

Two sources: one rule lt2dsl knows for every kind (head dims that are not a power of two), and
`LayerSpec.kernel_note(opts, cfg)`, where the spec of a kind says in its own words what its
kernels cannot take.
"""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic, warning
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import REGISTRY
from lt2dsl.validate.context import ShapeCtx, span_key
from lt2dsl.validate.rules import rule
from lt2dsl.validate.shapes import INHERITS, exact


def head_dims(m: n.Mixer) -> list[tuple[str, object, tuple[str, ...]]]:
    """The per-head widths the kernels of a mixer tile: (what, width, options that set it)."""
    o = m.opts
    d = o.get("head_dim")
    match m.type:
        case "gdn" | "retnet":
            return [("key head dim", d, ("head_dim",)),
                    ("value head dim", exact(d) * exact(o["expand_v"]), ("expand_v", "head_dim"))]
        case "gla":
            return [("key head dim", exact(d) * exact(o["expand_k"]), ("expand_k", "head_dim")),
                    ("value head dim", d, ("head_dim",))]
        case "mlstm":
            return [("key head dim", exact(d) * exact(o["qk_dim_factor"]), ("qk_dim_factor", "head_dim")),
                    ("value head dim", d, ("head_dim",))]
        case "tmm":
            return []  # FFT over the sequence: no per-head tiles
    return [("head dim", d, ("head_dim",))]


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@rule("W0401")
def check_head_dim_pow2(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Head dim not a power of two: the reference path runs.

    What it checks:
        Every per-head width a mixer's kernels tile (the attention head dim, the key and value
        head dims of the linear-attention family, Mamba2's head dim) is a power of two.

    Why it matters:
        The Triton kernels tile head dims in powers of two. Another width is still correct, but
        the block runs on the reference (PyTorch) implementation, which is much slower.

    Example:
        dim = 960
        head_dim = 96
        gdn

    Use instead:
        dim = 1024
        head_dim = 128
        gdn
    """
    groups: dict[tuple, tuple[object, list[str]]] = {}  # (where, width) → (span, what it is)
    for m in s.mixers():
        inherits = INHERITS if m.type != "mamba2" else ()
        for what, width, opts in head_dims(m):
            w = exact(width)
            if w.denominator != 1 or is_pow2(w.numerator):
                continue
            span = s.where(m, opts, inherits)
            _, descs = groups.setdefault((span_key(span), w.numerator), (span, []))
            if (desc := f"the {what} of `{m.type}`") not in descs:
                descs.append(desc)
    for (_, width), (span, descs) in groups.items():
        lo = 1 << (width.bit_length() - 1)
        yield warning("W0401", f"head dim {width} is not a power of two", span,
                      label="these blocks run on the reference path",
                      help=f"a head dim of {lo} or {2 * lo} runs the Triton kernel",
                      notes=(f"{width} is {_and(descs)}",
                             "the Triton kernels take power-of-two head dims; other widths fall back to "
                             "the PyTorch reference implementation"))


@rule("W0402")
def check_kernel_note(s: ShapeCtx) -> Iterator[Diagnostic]:
    """A kind's kernel cannot take these options: the reference path runs.

    What it checks:
        Asks each mixer's `LayerSpec.kernel_note(opts, cfg)` whether its fast kernels support
        the resolved options (for example a query/key-value head ratio the kernel does not
        take); the note names the path that will run.

    Why it matters:
        The model is still correct, but the block runs on a slower path than the user expects;
        the estimate's times assume the fast kernel.

    Example:
        dim = 1024
        nsa(heads=8, kv_heads=8)

    Use instead:
        dim = 1024
        nsa(heads=8, kv_heads=1)
    """
    for m in s.mixers():
        spec = REGISTRY[m.type]
        if spec.kernel_note is None or (note := spec.kernel_note(m.opts, s.cfg)) is None:
            continue
        call = s.call_of(m)
        yield warning("W0402", f"`{m.type}`: {note}", call.name_span if call else m.span,
                      label="kernel constraint")
