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

    fuse = not getattr(args, "no_fuse", False)
    model = compile_model(loaded.model, backend="auto", device="meta", fuse=fuse)
    cfg = loaded.model.config
    params = sum(p.numel() for p in model.parameters())
    gm = model.graph_module
    header = (
        f"# {cfg.name}: torch.fx code of the lowered model ({len(model.blocks)} blocks, "
        f"{model.applications} applications, {params:,} parameters, "
        f"{'fused: ' + _fired() if fuse else 'unfused'})"
    )
    console.file.write(header + gm.code.rstrip() + "\n")
    return EXIT_OK


def _fired() -> str:
    from lt2dsl.lowering.fx_passes import COUNTERS

    fired = [f"{name} x{count}" for name, count in COUNTERS.items() if count]
    return ", ".join(fired) or "no rule fired"
