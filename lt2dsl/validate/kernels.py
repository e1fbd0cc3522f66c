"""Kernel constraints (W04xx): warnings that say when a block will run on the reference path.

Two sources: the key-head-width limit of the delta-rule kernels, and
`LayerSpec.kernel_note(opts, cfg)`, where the spec of a kind says in its own words what its
kernels cannot take.
"""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic, warning
from lt2dsl.ir.registry import REGISTRY
from lt2dsl.validate.context import ShapeCtx
from lt2dsl.validate.rules import rule
from lt2dsl.validate.shapes import INHERITS

# The delta-rule Triton kernels hold a K × BV state tile per program; they take K ≤ 256
# (`lt2dsl/kernels/delta/ops.py`), and the ops fall back to PyTorch above that.
DELTA_KINDS = ("gdn", "kda", "deltanet")
MAX_DELTA_K = 256


@rule("W0401")
def check_delta_head_dim(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Key head dim above 256 on a delta-rule mixer: the reference path runs.

    What it checks:
        The key head dim of every `gdn`, `kda` and `deltanet` block is at most 256, the widest
        key head the delta-rule Triton kernels take.

    Why it matters:
        The model is still correct, but such a block runs on the reference (PyTorch) chunked
        form, which is much slower than the Triton kernels the estimate's times assume.

    Example:
        dim = 2048
        gdn(heads=4, head_dim=512)

    Use instead:
        dim = 2048
        gdn(heads=8, head_dim=256)
    """
    for m in s.mixers():
        K = m.opts.get("head_dim")
        if m.type not in DELTA_KINDS or not isinstance(K, int) or K <= MAX_DELTA_K:
            continue
        yield warning(
            "W0401",
            f"`{m.type}` key head dim {K} is above {MAX_DELTA_K}",
            s.where(m, ("head_dim",), INHERITS),
            label="this block runs on the reference path",
            help=f"use a head dim of at most {MAX_DELTA_K} (more heads) to run the Triton kernels",
            notes=(
                "the delta-rule Triton kernels take key head dims up to 256; wider heads fall "
                "back to the PyTorch reference implementation",
            ),
        )


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
        yield warning(
            "W0402", f"`{m.type}`: {note}", call.name_span if call else m.span, label="kernel constraint"
        )
