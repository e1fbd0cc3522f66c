"""The card's measured ceilings, and a hardware preset of them for the estimate (GPU only).

The estimate's presets for a card are its datasheet (`lt2dsl/cost/hw/h100.json`: 3.35 TB/s,
989 TFLOP/s); no kernel reaches those. A decode step is a read of the weights and caches, so its
ceiling is the fastest read of HBM: measured here as a plain read of 1 GiB (`decode_gemv`'s
`stream_read`, 4 programs an SM, past L2), beside a device-to-device copy (read + write, the
measure `h200-measured.json` took) and a bf16 8192³ matmul (the compute ceiling).

A decode step is also a chain of ~1,000 dependent kernels, and each costs time that moves no
byte: its launch, its programs' dispatch, the drain before the next may start. `kernel_us` is that
floor: a CUDA graph of 2,000 launches of a kernel that does almost nothing (4 programs an SM, one
store each) replayed, divided by 2,000 — the preset's `kernel_s`, which the estimate charges per
kernel of a decode step. Beside it, a read sweep (64 KiB … 64 MiB, each launch on its own buffer
so L2 never holds it) fitted to t = a + bytes / β: the intercept a is what a kernel that does read
costs on top of its bytes (ramp and drain as well), reported, not used.

Usage:
    PYTHONPATH=. python bench/ceilings.py [--name h100-measured] [--out DIR]
Prints a table; writes DIR/ceilings.json and DIR/NAME.json, a preset in `lt2dsl/cost/hw`'s format
(bandwidth: the read; flops: the matmul; memory: the card's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GIB = 1024**3


def read_GBps(nbytes: int = GIB) -> float:
    """A plain read of `nbytes` of bf16 in one launch (4 programs an SM), median of CUDA-graph
    replays; the buffer is far past L2, so every byte comes from HBM."""
    from decode_gemv import read_kernel
    from triton.testing import do_bench_cudagraph

    kernel = read_kernel()
    src = torch.ones(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    progs = 4 * torch.cuda.get_device_properties(0).multi_processor_count
    dst = torch.empty(progs, device="cuda", dtype=torch.float32)

    def run():
        kernel[(progs,)](src, dst, src.numel(), BLOCK=32768, num_warps=8)

    run()
    torch.cuda.synchronize()
    if float(dst.sum()) != src.numel():  # every element was read once
        raise RuntimeError(f"the read kernel summed {float(dst.sum())}, expected {src.numel()}")
    ms = do_bench_cudagraph(run, rep=100, return_mode="median")
    return nbytes / ms / 1e6


def _touch_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def touch(dst):
        tl.store(dst + tl.program_id(0), tl.program_id(0).to(tl.float32))

    return touch


def kernel_us(launches: int = 2000) -> dict:
    """µs one launch of a near-empty kernel costs in a CUDA graph chain of `launches`, with one
    program and with 4 programs an SM (median of replays)."""
    from triton.testing import do_bench_cudagraph

    touch = _touch_kernel()
    progs = 4 * torch.cuda.get_device_properties(0).multi_processor_count
    dst = torch.zeros(progs, device="cuda", dtype=torch.float32)
    out = {}
    for key, grid in (("kernel_us_one_program", 1), ("kernel_us", progs)):

        def run(grid=grid):
            for _ in range(launches):
                touch[(grid,)](dst)

        run()
        torch.cuda.synchronize()
        out[key] = do_bench_cudagraph(run, rep=100, return_mode="median") * 1e3 / launches
    return out


def read_sweep(sizes_kib=(64, 256, 1024, 4096, 16384, 65536), chain: int = 64) -> dict:
    """µs a read of each size costs in a CUDA graph chain of `chain` reads of distinct buffers
    (together past L2), and the least-squares line t = a + bytes / β through them."""
    from decode_gemv import read_kernel
    from triton.testing import do_bench_cudagraph

    kernel = read_kernel()
    progs = 4 * torch.cuda.get_device_properties(0).multi_processor_count
    dst = torch.empty(progs, device="cuda", dtype=torch.float32)
    points = []
    for kib in sizes_kib:
        n = kib * 1024 // 2
        copies = max(chain, -(-(256 * 1024**2) // (n * 2)))  # at least 256 MiB in the ring
        copies = min(copies, 4096)
        bufs = torch.ones(copies, n, device="cuda", dtype=torch.bfloat16)

        def run(bufs=bufs, n=n, copies=copies):
            for i in range(chain):
                kernel[(progs,)](bufs[i % copies], dst, n, BLOCK=4096, num_warps=8)

        run()
        torch.cuda.synchronize()
        us = do_bench_cudagraph(run, rep=100, return_mode="median") * 1e3 / chain
        points.append({"bytes": n * 2, "us": us, "GBps": n * 2 / us / 1e3})
        del bufs
    xs = [p["bytes"] for p in points]
    ys = [p["us"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"read_sweep": points, "read_fit_a_us": my - slope * mx, "read_fit_GBps": 1e-3 / slope}


def measure() -> dict:
    from harness import measure_ceilings

    props = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "sms": props.multi_processor_count, "memory_bytes": props.total_memory, "read_GBps": read_GBps(),
            **kernel_us(), **read_sweep(), **measure_ceilings()}  # fmt: skip


def preset(name: str, m: dict) -> dict:
    """A hardware preset of the measured ceilings (fp16 = bf16 and fp8 = 2 · bf16, as the datasheet
    presets' ratios are; fp32 is not measured, so it keeps the dense ratio of 1/15); `kernel_s` is
    the near-empty kernel's cost at 4 programs an SM."""
    bf16 = m["bf16_TFLOPs"] * 1e12
    return {
        "name": name,
        "description": f"{m['device']}, ceilings measured in this project's GPU runs",
        "peak_flops": {"bf16": bf16, "fp16": bf16, "fp8": 2 * bf16, "fp32": bf16 / 15},
        "hbm_bytes_per_s": m["read_GBps"] * 1e9,
        "memory_bytes": m["memory_bytes"],
        "kernel_s": m["kernel_us"] * 1e-6,
        "source": "bench/ceilings.py: a plain 1 GiB read of HBM (bandwidth), a bf16 8192^3 torch "
        "matmul (flops), a CUDA graph of 2,000 near-empty launches (kernel_s)",
    }


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="h100-measured", help="the preset's name [h100-measured]")
    p.add_argument("--out", type=Path, default=Path("."), help="folder of the JSON files [.]")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: bench/ceilings.py measures a CUDA device; none is available")
    m = measure()
    t = Table(title=f"measured ceilings, {m['device']}")
    for col in ("what", "measured"):
        t.add_column(col, justify="right" if col == "measured" else "left")
    t.add_row("HBM read, 1 GiB, one launch", f"{m['read_GBps']:.0f} GB/s")
    t.add_row("device-to-device copy, 1 GiB (read + write)", f"{m['copy_GBps']:.0f} GB/s")
    t.add_row("bf16 matmul 8192³", f"{m['bf16_TFLOPs']:.0f} TFLOP/s")
    t.add_row("near-empty kernel in a graph chain, 4 programs an SM", f"{m['kernel_us']:.2f} µs")
    t.add_row("… one program", f"{m['kernel_us_one_program']:.2f} µs")
    t.add_row(
        "read sweep 64 KiB – 64 MiB: t = a + bytes / β",
        f"a {m['read_fit_a_us']:.2f} µs, β {m['read_fit_GBps']:.0f} GB/s",
    )
    Console().print(t)
    args.out.mkdir(parents=True, exist_ok=True)
    for fname, data in (("ceilings.json", m), (f"{args.name}.json", preset(args.name, m))):
        tmp = args.out / (fname + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, args.out / fname)


if __name__ == "__main__":
    main()
