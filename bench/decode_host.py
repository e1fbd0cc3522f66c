"""Host time of one whole-model decode step, on the CPU: what a GPU decode step waits for.

The decode steps measured on the H200 (BENCHMARKS.md, "Whole-model decode") were host-bound:
130–190 ms per token for the GDN+DSA hybrid against ~4 ms of memory traffic. This script measures
the host side alone, without a GPU: the model runs its Triton path under the CPU interpreter with
every kernel launch and every projection GEMM replaced by a no-op (outputs allocated, never
computed), so what is timed is Python, op dispatch, argument checks and allocation. The numbers
are this CPU's; the GPU machine's host is faster, and its real Triton launcher (stubbed here) adds
its own cost per launch.

Usage:
    PYTHONPATH=. python bench/decode_host.py
Environment: MODEL (example stem, default `lt2_hybrid_gdn_dsa`), STEPS (per repeat, 5), REPEATS
(7), CONTEXT (prefill length, 8). Toy sizes (dim 64, 2 heads of 32, vocab 256; the rest of the
example as written). Prints min and median ms per step, and the step's kernel-launching aten ops
(aten ops outside other aten ops that launch at least one kernel on a GPU: views, allocations and
no-op casts aside; the stubbed GEMMs and Triton kernels not included; `bench/decode_launches.py`
counts every launch by kind), and writes $OUT/decode_host.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the CPU launch path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import collections

    import lt2dsl
    from bench.decode_launches import count_step, stubbed_kernels, totals

    stem = os.environ.get("MODEL", "lt2_hybrid_gdn_dsa")
    steps, repeats = int(os.environ.get("STEPS", 5)), int(os.environ.get("REPEATS", 7))
    context = int(os.environ.get("CONTEXT", 8))
    torch.set_num_threads(1)
    model = lt2dsl.compile(
        os.path.join(ROOT, "examples", f"{stem}.lt2"),
        backend="triton",
        dtype=torch.bfloat16,
        device="cpu",
        dim=64,
        heads=2,
        head_dim=32,
        vocab=256,
    ).eval()
    _ = model.graph_module  # trace with the real ops, then stub them
    cache = model.new_cache(1, max_len=context + (repeats + 1) * steps + 8)
    per_step = []
    with torch.no_grad(), stubbed_kernels():
        model(torch.randint(0, 256, (1, context)), cache)
        tok = torch.randint(0, 256, (1, 1))
        for _ in range(steps):  # warm
            model(tok, cache)
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(steps):
                model(tok, cache)
            per_step.append(1000 * (time.perf_counter() - t0) / steps)
        # aten ops that launch a kernel, matrix products included (the stubbed ones not)
        t = totals(count_step(lambda: model(tok, cache), collections.Counter()))
        ops = t["aten"] + t["gemm"]
    row = {
        "model": stem,
        "launching_aten_ops": ops,
        "min_ms": min(per_step),
        "median_ms": statistics.median(per_step),
        "repeats_ms": per_step,
        "torch": torch.__version__,
    }
    print(
        f"{stem}: host per decode step {row['min_ms']:.1f} ms min, {row['median_ms']:.1f} ms median; "
        f"{ops} kernel-launching aten ops per step"
    )
    out = os.environ.get("OUT", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "decode_host.json"), "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
