"""`lt2dsl warmup FILE... --ctx ... --batch ...`: the `warmup` verb of `lt2dsl/cli.py`.

One generate per shape (`bench.warm`) compiles and autotunes every kernel its prefill chunks and
decode step launch; Triton keeps both on disk (`kernels.common.backend.keep_autotune_results`), so a
later process's first generate at those shapes times no kernel config.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from lt2dsl.cli import EXIT_ERRORS, EXIT_OK
from lt2dsl.engine import bench
from lt2dsl.engine.cli import load_models, model_arguments, pick_device, progress_bar, sizes, wide


def add_arguments(p: argparse.ArgumentParser) -> None:
    model_arguments(p, ctx="4k", batch="1")


def run(args, out, err) -> int:
    device = pick_device(args)
    models = load_models(args, err, device)
    if models is None:
        return EXIT_ERRORS
    batches, contexts = sizes(args.batch, "--batch"), sizes(args.ctx, "--ctx")
    if device.type != "cuda":
        # the compile and autotune caches it fills are a GPU's; on the CPU it only times generates
        err.print(f"note: on {device.type} no kernel is compiled or tuned; warm up on the GPU that decodes")
    with progress_bar(err, "warm-up", models, batches, contexts) as advance:
        rows = bench.warm(models, batches, contexts, advance)
    t = Table(title=f"warm-up on {bench.device_name(device)}")
    for col in ("model", "B", "context", "first generate s"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["model"], str(r["batch"]), str(r["ctx"]), f"{r['first_s']:.2f}")
    wide(out).print(t)
    return EXIT_OK
