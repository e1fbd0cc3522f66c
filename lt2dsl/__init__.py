"""lt2dsl: a compiler-driven DSL for looped linear-time transformers.

`import lt2dsl` stays free of torch: `compile` imports the lowering (and torch) on first call.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from lt2dsl.ir.nodes import Model, Program
    from lt2dsl.lowering.model import LT2Model

__all__ = ["compile", "from_pretrained"]


def compile(
    source: str | os.PathLike | Program | Model,
    *,
    backend: str = "auto",
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    fuse: bool = True,
    build_graph: bool | None = None,
    opt_in: tuple[str, ...] = (),
    **overrides: Any,
) -> LT2Model:
    """Compile a `.lt2` program into a trainable `LT2Model` (a `torch.nn.Module`).

    Args:
        source: a path or `.lt2` text (or a parsed `Program` / resolved `Model`).
        backend (str, Optional): "reference" (pure PyTorch), "triton" or "auto" (Triton where a
            kernel exists for the device, reference elsewhere). Default: "auto".
        device (Optional): where the parameters are created; "meta" allocates nothing.
        dtype (Optional): parameter and activation dtype; default the model's `dtype` setting
            (bf16 unless set). Recurrent states stay in `state_dtype` (fp32).
        fuse (bool, Optional): fuse adjacent operations of the lowered graph into single kernels
            (`lt2dsl.lowering.fx_passes`); False runs the unfused graph. Default: True.
        build_graph (bool, Optional): trace and fuse the graph now rather than in the first forward
            or `generate`. Default: on CUDA devices only (a CPU or meta model may never run whole).
        opt_in (tuple[str, ...], Optional): fusion rules that are off by default to run too
            (`lt2dsl.lowering.fx_passes.OPT_IN`): "decode_gemv" fuses a decode step's projections
            with their norms, residual adds and SwiGLU (docs/decode.md). Default: none.
        **overrides: settings as `--set` gives them, e.g. `loop_T=8`, `dim=256`.

    Returns:
        LT2Model: `model(input_ids [B, T], cache=None) -> logits [B, T, vocab]`, `new_cache(B)`,
        `generate(...)`, `graph_module`.

    Raises:
        DiagnosticError: the program has errors (rendered like `lt2dsl check` prints them).
        ValueError: a bad argument (backend, dtype, override value).
    """
    from lt2dsl.lowering import compile_model

    return compile_model(
        source,
        backend=backend,
        device=device,
        dtype=dtype,
        overrides=overrides,
        fuse=fuse,
        build_graph=build_graph,
        opt_in=opt_in,
    )


def from_pretrained(path: str | os.PathLike, **kwargs: Any) -> LT2Model:
    """The `LT2Model` of a local Hugging Face checkpoint folder (`lt2dsl.hf.from_pretrained`: its
    `.lt2` program written by the importer, its weights loaded). Needs the `hf` extra."""
    from lt2dsl.hf.importer import from_pretrained as load

    return load(path, **kwargs)
