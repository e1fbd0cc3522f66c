"""A fresh process's `compile` and first two `generate` calls, timed, with where each one's time went.

Run by `test_gpu.py` in a fresh process (`python -m tests.engine.first_call MODEL.lt2` from the
repository root): compiles the model (on CUDA in bf16 by default), times two generates of `--new`
tokens after a `--prompt`-token prompt, and prints one line `FIRST_CALL {json}`: the compile's and
both generates' seconds, and per phase of each its seconds and calls. Phases nest (the graph's
codegen is part of its trace and of its fusion; the capture's warm-up step loads kernels too), so
they do not add up. Triton's own autotuning report (`knobs.autotuning.print`) names every kernel
whose configs were timed rather than read from disk; a phase with no calls was not reached.

`--device cpu` times the same phases of the eager static-cache path (no capture, no Triton):
the Python-side work of a first call, the same on any machine.
"""

from __future__ import annotations

import argparse
import functools
import json
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
    """Time the phases of a first call: the graph's trace and fusion, the engine's per-bucket state,
    prefill, eager steps, the capture's warm-up and record, and on CUDA Triton's kernel loading."""
    import torch.fx

    import lt2dsl.engine.engine as engine
    import lt2dsl.lowering.fx_passes as fx_passes
    import lt2dsl.lowering.model as model
    from lt2dsl.engine import cache, step
    from lt2dsl.lowering.leaf import LeafTracer

    timed(model, "to_fx", "graph: trace + GraphModule (to_fx)", sync=False)
    timed(LeafTracer, "trace", "graph: trace (LeafTracer)", sync=False)
    timed(fx_passes, "fuse", "graph: fusion passes", sync=False)
    timed(torch.fx.GraphModule, "recompile", "graph: codegen (GraphModule.recompile)", sync=False)
    timed(engine, "Slot", "engine: bucket slot (cache + step buffers)")
    timed(cache.StaticCache, "allocate", "engine: cache allocation")
    timed(engine, "prefill", "prefill (eager)")
    timed(engine, "decode_one", "decode step, eager (incl. warm-up and capture)")
    timed(step, "warm_up", "capture: warm-up steps")
    timed(step, "record", "capture: graph record", sync=False)
    timed(step.Captured, "__call__", "capture: replays")
    if torch.cuda.is_available():
        _instrument_triton()


def _instrument_triton() -> None:
    import triton
    import triton.compiler
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    triton.knobs.autotuning.print = True
    timed(Autotuner, "_bench", "triton: autotune configs timed")
    timed(Autotuner, "check_disk_cache", "triton: autotune disk cache read")
    timed(JITFunction, "_do_compile", "triton: kernel compile / cache load", sync=False)
    timed(triton.compiler, "compile", "triton: compile() (cache lookup + build)", sync=False)
    timed(CompiledKernel, "_init_handles", "triton: binaries loaded", sync=False)


def snapshot() -> dict[str, list]:
    """The phases so far, slowest first: name → [seconds, calls]; then clear them."""
    out = {k: [round(s, 3), n] for k, (s, n) in sorted(PHASES.items(), key=lambda kv: -kv[1][0])}
    PHASES.clear()
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m tests.engine.first_call")
    p.add_argument("model", help=".lt2 file")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt", type=int, default=1024, help="prompt tokens (batch 1)")
    p.add_argument("--new", type=int, default=16, help="new tokens per generate")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a model override")
    args = p.parse_args(argv)
    overrides = {k: int(v) if v.isdigit() else v for k, v in (s.split("=", 1) for s in args.set)}

    import lt2dsl

    instrument()
    t0 = time.perf_counter()
    dtype = getattr(torch, args.dtype)
    model = lt2dsl.compile(args.model, device=args.device, dtype=dtype, build_graph=True, **overrides)
    model.eval()
    sync(args.device)
    got: dict = {"device": args.device, "compile": time.perf_counter() - t0, "compile_phases": snapshot()}
    ids = torch.zeros(1, args.prompt, dtype=torch.long, device=args.device)
    for name in ("first", "second"):
        sync(args.device)
        t0 = time.perf_counter()
        model.generate(ids, args.new)
        sync(args.device)
        got[name] = time.perf_counter() - t0
        got[f"{name}_phases"] = snapshot()
    print("FIRST_CALL " + json.dumps(got))
    return got


if __name__ == "__main__":
    main()
