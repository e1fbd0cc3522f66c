"""A fresh process's first two `generate` calls, timed, with where the first one's extra time went.

Run by `test_gpu.py` in a fresh process (`python -m tests.engine.first_call MODEL.lt2` from the
repository root): compiles the model on CUDA in bf16, times two generates of 16 tokens after a
1024-token prompt, and prints one line `FIRST_CALL {json}`: both times and, per phase of the first
call, its seconds and calls (phases nest: the capture's warm-up steps load kernels too). Triton's
own autotuning report (`knobs.autotuning.print`) names every kernel whose configs were timed
rather than read from disk; a phase with no calls was not reached by its hook.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections import defaultdict

import torch

PHASES: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])


def timed(owner, name: str, phase: str, sync: bool = True) -> None:
    """Wrap `owner.name` so its wall time and calls add to `PHASES[phase]`; with `sync` the device is
    synchronised on exit (not while a graph is being captured)."""
    fn = getattr(owner, name, None)
    if fn is None:
        return

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if sync and torch.cuda.is_available() and not torch.cuda.is_current_stream_capturing():
                torch.cuda.synchronize()
            PHASES[phase][0] += time.perf_counter() - t0
            PHASES[phase][1] += 1

    setattr(owner, name, wrapper)


def instrument() -> None:
    import triton
    import triton.compiler
    from triton.runtime.autotuner import Autotuner

    import lt2dsl.engine.engine as engine
    from lt2dsl.engine import cache, step
    from lt2dsl.lowering.model import LT2Model

    triton.knobs.autotuning.print = True
    timed(engine, "prefill", "prefill (eager)")
    timed(step.Captured, "__init__", "capture: warm-up steps + graph")
    timed(cache.StaticCache, "allocate", "cache allocation")
    timed(Autotuner, "_bench", "autotune: configs timed")
    timed(Autotuner, "check_disk_cache", "autotune: disk cache read")
    timed(triton.compiler, "compile", "triton compile / cache load")
    getter = LT2Model.graph_module.fget
    holder = type("Holder", (), {"fget": staticmethod(getter)})
    timed(holder, "fget", "graph trace + fusion", sync=False)
    LT2Model.graph_module = property(holder.fget)


def main(path: str) -> None:
    import lt2dsl

    instrument()
    model = lt2dsl.compile(path, device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.zeros(1, 1024, dtype=torch.long, device="cuda")
    times, phases = [], {}
    for i in range(2):
        PHASES.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, 16)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if i == 0:
            phases = {k: [round(s, 3), n] for k, (s, n) in sorted(PHASES.items(), key=lambda kv: -kv[1][0])}
    print("FIRST_CALL " + json.dumps({"first": times[0], "second": times[1], "first_phases": phases}))


if __name__ == "__main__":
    main(sys.argv[1])
