"""`lt2dsl compile FILE --emit fx`: print the lowered model's `torch.fx` code."""

from __future__ import annotations

import argparse

EXIT_OK = 0


def emit_fx(loaded, args: argparse.Namespace, console) -> int:
    """Lower `loaded.model` and write its GraphModule's Python code to `console`.

    The module is built on the `meta` device, so even a billion-parameter model prints without
    allocating its weights. Returns the exit code (0).
    """
    from lt2dsl.lowering import compile_model

    model = compile_model(loaded.model, backend="auto", device="meta")
    cfg = loaded.model.config
    params = sum(p.numel() for p in model.parameters())
    header = (f"# {cfg.name}: torch.fx code of the lowered model ({len(model.blocks)} blocks, "
              f"{model.applications} applications, {params:,} parameters)")
    console.file.write(header + model.graph_module.code.rstrip() + "\n")
    return EXIT_OK
