"""Shared timing harness for the GPU benchmarks (`bench/kernel_times.py`, `bench/blocks.py`).

Each benchmark module registers `Case`s; `run_cases` times them with `triton.testing.do_bench`
(median, events), prints a short table last and writes every figure to `$OUT/<name>.json`.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Case:
    """One timed thing. `make()` returns (fn, leaves): fn() runs it, leaves get their grads reset."""

    group: str  # e.g. "gdn fwd B=4 T=8192"
    impl: str  # "lt2dsl", "fla", "sdpa", ...
    make: Callable[[], tuple[Callable[[], object], list[torch.Tensor]]]
    backward: bool = False  # time forward+backward
    flops: float | None = None  # useful FLOPs of one call, for achieved FLOP/s
    bytes: float | None = None  # minimal bytes moved by one call, for achieved bandwidth
    extra: dict = field(default_factory=dict)


def _first(out):
    return out[0] if isinstance(out, tuple | list) else out


def time_case(c: Case, warmup: int = 25, rep: int = 100) -> float:
    from triton.testing import do_bench

    fn, leaves = c.make()
    if not c.backward:
        return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    o = _first(fn())
    do = torch.randn_like(o)

    def fb():
        _first(fn()).backward(do)

    return do_bench(fb, warmup=warmup, rep=rep, grad_to_none=leaves, return_mode="median")


def kernel_times(fn: Callable[[], object], reps: int, warm: int = 3) -> list[dict]:
    """Each kernel `fn()` launches, by the torch profiler over `reps` calls after `warm` unprofiled
    ones: `{"kernel", "us_per_call", "launches_per_call"}`, the most device time first."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = _device_us(e)
        if us > 0 and e.count > 0:
            rows.append({"kernel": e.key, "us_per_call": us / reps, "launches_per_call": e.count / reps})
    rows.sort(key=lambda r: -r["us_per_call"])
    return rows


def _device_us(evt) -> float:
    for name in ("device_time_total", "cuda_time_total"):
        if hasattr(evt, name):
            return float(getattr(evt, name))
    return 0.0


def measure_ceilings() -> dict:
    """Device-to-device copy bandwidth (read + write) and bf16 matmul rate, measured now."""
    from triton.testing import do_bench

    n = 1024**3
    src = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=50, return_mode="median")
    copy = 2 * n * 2 / ms / 1e6  # GB/s, read + write
    src = dst = None  # free 4 GiB before the matmul
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=10, rep=50, return_mode="median")
    return {"copy_GBps": copy, "bf16_TFLOPs": 2 * 8192**3 / ms / 1e9}


def run_cases(name: str, cases: list[Case], ceilings: dict | None = None) -> list[dict]:
    rows = []
    for c in cases:
        row = {"group": c.group, "impl": c.impl, "backward": c.backward, **c.extra}
        try:
            ms = time_case(c)
            row["ms"] = ms
            if c.flops:
                row["TFLOPs"] = c.flops / ms / 1e9
            if c.bytes:
                row["GBps"] = c.bytes / ms / 1e6
        except Exception as e:  # a failing impl must not hide the others' numbers
            row["error"] = repr(e)[:300]
            traceback.print_exc()
        rows.append(row)
        print(_fmt_row(row, ceilings), flush=True)
        torch.cuda.empty_cache()
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump({"ceilings": ceilings, "rows": rows, "versions": versions()}, f, indent=1)
    return rows


def _fmt_row(r: dict, ceil: dict | None) -> str:
    if "error" in r:
        return f"{r['group']:40s} {r['impl']:10s} ERROR {r['error'][:80]}"
    s = f"{r['group']:40s} {r['impl']:10s} {r['ms']:9.3f} ms"
    if "TFLOPs" in r:
        s += f" {r['TFLOPs']:7.1f} TFLOP/s"
    if "GBps" in r:
        pct = f" ({100 * r['GBps'] / ceil['copy_GBps']:.0f}% copy)" if ceil else ""
        s += f" {r['GBps']:8.0f} GB/s{pct}"
    return s


def summary_table(rows: list[dict], baseline_impl: str = "fla") -> str:
    """Ratio of every impl to `baseline_impl` within each (group, backward)."""
    base = {(r["group"], r["backward"]): r.get("ms") for r in rows if r["impl"] == baseline_impl}
    lines = [f"{'group':40s} {'impl':10s} {'mode':8s} {'ms':>9s} {'vs ' + baseline_impl:>9s}"]
    for r in rows:
        b = base.get((r["group"], r["backward"]))
        ms = r.get("ms")
        ratio = f"{b / ms:8.2f}x" if (b and ms) else "      -"
        mode = "fwd+bwd" if r["backward"] else "fwd"
        t = f"{ms:9.3f}" if ms else "    error"
        lines.append(f"{r['group']:40s} {r['impl']:10s} {mode:8s} {t} {ratio}")
    return "\n".join(lines)


def versions() -> dict:
    v = {"torch": torch.__version__}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name()
    try:
        import fla

        v["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        pass
    return v
