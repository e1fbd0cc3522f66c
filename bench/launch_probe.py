"""Host time of one Triton launch on the GPU machine, by path (no synchronisation in the loop).

A 12-argument kernel shaped like the Toeplitz passes (4 pointers, 6 integers, constexprs), on a
small grid so the GPU keeps up: Triton's own launch, `common.launch`, the kept CompiledKernel's
runner, its launcher called directly, and a torch op for scale; then a profile of the runner.
Usage (GPU machine, repo root): python3 bench/launch_probe.py
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@triton.jit
def _k(x, m, out, bias, T, M, C, s_b, s_r, s_J, S: tl.constexpr, BC: tl.constexpr):
    o = tl.program_id(0) * BC + tl.arange(0, BC)
    tl.store(out + o, tl.load(x + o) + tl.load(m + o) + tl.load(bias + o) + T + M + C + s_b + s_r + s_J + S)


def per_call_us(fn, n=400, warmup=20) -> float:
    """Host µs per call of fn over n calls, no synchronisation in the loop (the toeplitz probe
    uses it too)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    return dt * 1e6


def main() -> None:
    from triton.runtime import driver

    from lt2dsl.kernels.common import launch as L

    dev = "cuda"
    x, m, out, b = (torch.zeros(4096, device=dev) for _ in range(4))
    args = (x, m, out, b, 32768, 256, 1024, 1 << 20, 1 << 14, 1024)
    grid = (16, 1, 1)
    ck = _k[grid](*args, S=128, BC=256)
    st = driver.active.get_current_stream(torch.cuda.current_device())
    ck._init_handles()
    rows = {
        "torch.empty(1) on the GPU": per_call_us(lambda: torch.empty(1, device=dev)),
        "x.add_(1.0)": per_call_us(lambda: x.add_(1.0)),
        "kernel[grid](...) (Triton's own launch)": per_call_us(lambda: _k[grid](*args, S=128, BC=256)),
        "common.launch, static launcher": per_call_us(lambda: L.launch(_k, grid, (), *args, S=128, BC=256)),
        "CompiledKernel[grid](*args)": per_call_us(lambda: ck[grid](*args, 128, 256)),
        "CompiledKernel.run(...) direct": per_call_us(
            lambda: ck.run(16, 1, 1, st, ck.function, ck.packed_metadata, None, None, None, *args, 128, 256)
        ),
        "get_current_stream": per_call_us(lambda: driver.active.get_current_stream(0)),
        "torch.cuda.current_device": per_call_us(lambda: torch.cuda.current_device()),
        "common.launch._spec(args)": per_call_us(lambda: L._spec(args)),
    }
    L.MODE = "runner"
    rows["common.launch, runner"] = per_call_us(lambda: L.launch(_k, grid, (), *args, S=128, BC=256))
    L.MODE = "static"
    rows["launch counts"] = dict(L.COUNTS)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(400):
        ck[grid](*args, 128, 256)
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    print(buf.getvalue()[:4000])
    with open(os.path.join(os.environ.get("OUT", "."), "launch_probe.json"), "w") as fh:
        meta = {"triton": triton.__version__, "torch": torch.__version__}
        json.dump({**meta, "us_per_call": rows}, fh, indent=1)
    print(f"host µs per call (triton {triton.__version__}, torch {torch.__version__})")
    for k, v in rows.items():
        print(f"{k:45s} {v:8.2f}" if isinstance(v, float) else f"{k:45s} {v}")


if __name__ == "__main__":
    main()
