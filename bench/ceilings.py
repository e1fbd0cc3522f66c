"""The card's measured ceilings, and a hardware preset of them for the estimate (GPU only).

The estimate's presets for a card are its datasheet (`lt2dsl/cost/hw/h100.json`: 3.35 TB/s,
989 TFLOP/s); no kernel reaches those. A decode step is a read of the weights and caches, so its
ceiling is the fastest read of HBM: measured here as a plain read of 1 GiB (`decode_gemv`'s
`stream_read`, 4 programs an SM, past L2), beside a device-to-device copy (read + write, the
measure `h200-measured.json` took) and a bf16 8192³ matmul (the compute ceiling).

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


def measure() -> dict:
    from harness import measure_ceilings

    props = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "sms": props.multi_processor_count, "memory_bytes": props.total_memory, "read_GBps": read_GBps(),
            **measure_ceilings()}  # fmt: skip


def preset(name: str, m: dict) -> dict:
    """A hardware preset of the measured ceilings (fp16 = bf16 and fp8 = 2 · bf16, as the datasheet
    presets' ratios are; fp32 is not measured, so it keeps the dense ratio of 1/15)."""
    bf16 = m["bf16_TFLOPs"] * 1e12
    return {
        "name": name,
        "description": f"{m['device']}, ceilings measured in this project's GPU runs",
        "peak_flops": {"bf16": bf16, "fp16": bf16, "fp8": 2 * bf16, "fp32": bf16 / 15},
        "hbm_bytes_per_s": m["read_GBps"] * 1e9,
        "memory_bytes": m["memory_bytes"],
        "source": "bench/ceilings.py: a plain 1 GiB read of HBM (bandwidth) and a bf16 8192^3 torch "
        "matmul (flops)",
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
    Console().print(t)
    args.out.mkdir(parents=True, exist_ok=True)
    for fname, data in (("ceilings.json", m), (f"{args.name}.json", preset(args.name, m))):
        tmp = args.out / (fname + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, args.out / fname)


if __name__ == "__main__":
    main()
