"""Where a whole-model decode step's time goes on the GPU: kernels by kind, and the card's idle gaps.

`lt2dsl bench decode` gives a step's wall time; `bench/decode_launches.py` counts its launches on the
CPU. This splits the measured step between the kernels themselves and the time between them. For
each model and (batch, context) it prefills a random prompt through the engine (`LT2Model.generate`'s
CUDA-graph step), times `--steps` replayed steps between CUDA events, then records `--profiled`
more under the torch profiler (CUPTI reports the kernels a replayed graph runs) and reports per step:

* kernels by kind: `gemm` (cuBLAS / CUTLASS names), `triton` (one of lt2dsl's `@triton.jit`
  kernels), `aten` (torch's own elementwise, reduction, copy and index kernels), `other`: count, µs,
  mean µs a kernel;
* busy: the union of the kernels' intervals; idle = step − busy (launch latency, dependencies
  between tiny kernels, host work inside the step);
* the top kernels by time, and every kernel by name with its kind (`by_name`, in the JSON).

A step whose busy time is near the estimate's bytes-time and whose idle time is large is bound by
the launch chain (fuse kernels); a step whose kernels alone take long is bound by slow kernels
(a GEMV below the card's bandwidth, a long serial scan). Results: a table per point and
`<out>/decode_profile.json` naming the card and the `lt2dsl` package profiled: the one first on
`PYTHONPATH`, else this checkout's (`bench/decode_ab.py --profile` profiles another commit's so).

    python bench/decode_profile.py examples/lt2_hybrid_gdn_dsa.lt2 --ctx 4096,32768 --batch 1 \\
        --prefill --out $OUT/prof                                      # on the GPU
    python bench/decode_profile.py examples/lt2_sparse_dsa.lt2 --device cpu --ctx 16 --steps 2 \\
        --profiled 2 --out /tmp/prof                # CPU, no graphs: aten ops stand in; no claims
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
# appended, not first: a tree first on PYTHONPATH (decode_ab's base) is the package profiled
sys.path.append(str(ROOT))

import lt2dsl  # noqa: E402
from lt2dsl.cli import UsageError, overrides_of, report  # noqa: E402
from lt2dsl.cost.cli import UsageError as SizeError  # noqa: E402
from lt2dsl.cost.cli import parse_lengths  # noqa: E402
from lt2dsl.engine.engine import Engine  # noqa: E402
from lt2dsl.frontend import load  # noqa: E402
from lt2dsl.train.files import atomic_write  # noqa: E402

GEMM = re.compile(
    r"gemm|gemv|cutlass|xmma|cublas|sm90_|ampere_|splitK|nvjet|^aten::(linear|mm|addmm|bmm|matmul|einsum)$",
    re.I,
)
ATEN = re.compile(
    r"aten::|at::|native::|elementwise|reduce_kernel|vectorized|index_|indexSelect|memcpy|memset", re.I
)


def kind_of(name: str, triton_names: set[str]) -> str:
    if GEMM.search(name):
        return "gemm"
    if name in triton_names or name.split("_0d")[0] in triton_names:
        return "triton"
    if ATEN.search(name):
        return "aten"
    return "other"


def triton_kernels() -> set[str]:
    """The names of lt2dsl's Triton kernels (the GPU reports a launch by its function's name)."""
    import triton

    names = set()
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("lt2dsl.kernels"):
            for obj in vars(mod).values():
                while obj is not None and not isinstance(obj, triton.runtime.jit.JITFunction):
                    obj = getattr(obj, "fn", None)  # an autotuner or heuristics wrapper
                if obj is not None:
                    names.add(obj.fn.__name__)
    return {n for n in names if n}


def union_us(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (µs)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(events, steps: int, triton_names: set[str], cuda: bool) -> dict:
    """Per-step kernel counts and µs by kind, busy µs, the top kernels (device events on CUDA, the
    top-level aten ops on the CPU)."""
    if cuda:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    else:
        kernels = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None]
    by_kind: dict[str, list[float]] = {}
    by_name: dict[str, list[float]] = {}
    spans = []
    for e in kernels:
        us = e.time_range.end - e.time_range.start
        spans.append((e.time_range.start, e.time_range.end))
        by_kind.setdefault(kind_of(e.name, triton_names), []).append(us)
        by_name.setdefault(e.name, []).append(us)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    return {
        "kinds": {
            k: {"count": len(v) / steps, "us": sum(v) / steps, "mean_us": sum(v) / len(v)}
            for k, v in sorted(by_kind.items())
        },
        "busy_us": union_us(spans) / steps,
        "kernels": len(kernels) / steps,
        "top": [{"name": n[:90], "count": len(v) / steps, "us": sum(v) / steps} for n, v in ranked[:15]],
        "by_name": [
            {"name": n[:120], "kind": kind_of(n, triton_names), "count": len(v) / steps, "us": sum(v) / steps}
            for n, v in ranked
        ],
    }


def point(model, batch: int, ctx: int, args) -> dict:
    """One (batch, context): the replayed steps' time and their kernels; where the profiler sees no
    kernel inside a replayed graph, the kernels of the same steps run eagerly (`source`)."""
    row = run_point(model, batch, ctx, args, capture=None)
    if row["kernels"] == 0 and model.embed.weight.device.type == "cuda":
        eager = run_point(model, batch, ctx, args, capture=False)
        row = eager | {"step_us": row["step_us"], "eager_step_us": eager["step_us"]}
        row["idle_us"] = max(row["step_us"] - row["busy_us"], 0.0)
    return row


def run_point(model, batch: int, ctx: int, args, capture) -> dict:
    device = model.embed.weight.device
    cuda = device.type == "cuda"
    engine = Engine(model, capture=capture)
    gen = torch.Generator().manual_seed(ctx * 1000 + batch)
    ids = torch.randint(0, model.config.vocab, (batch, ctx), generator=gen).to(device)
    stream = engine.stream(ids, 1 + args.warm + args.steps + args.profiled)
    for _ in range(1 + args.warm):
        next(stream)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
    else:
        t0 = time.perf_counter()
    for _ in range(args.steps):
        next(stream)
    if cuda:
        end.record()
        torch.cuda.synchronize()
        step_us = start.elapsed_time(end) * 1e3 / args.steps
    else:
        step_us = (time.perf_counter() - t0) * 1e6 / args.steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.profiled):
            next(stream)
        if cuda:
            torch.cuda.synchronize()
    stream.close()
    # after the steps ran: the kernel modules a step imports on its first call are known by now
    row = summarize(prof.events(), args.profiled, triton_kernels(), cuda)
    if args.prefill:
        row["prefill"] = profile_prefill(engine, ids, cuda)
    engine.release()
    row.update(batch=batch, ctx=ctx, step_us=step_us, idle_us=max(step_us - row["busy_us"], 0.0))
    row["source"] = "replayed graphs" if engine.capture else "eager steps"
    return row


def profile_prefill(engine: Engine, ids: torch.Tensor, cuda: bool) -> dict:
    """The prompt's prefill (the engine's chunks, and the first token's sampling) under the profiler:
    its wall µs, its kernels by kind, busy and idle, the top kernels."""
    stream = engine.stream(ids, 1)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        next(stream)
        if cuda:
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    stream.close()
    out = summarize(prof.events(), 1, triton_kernels(), cuda)
    out.update(step_us=wall_us, idle_us=max(wall_us - out["busy_us"], 0.0), source="eager prefill")
    return out


def show(console: Console, name: str, row: dict) -> None:
    t = Table(
        title=f"{name} B={row['batch']} L={row['ctx']}: step {row['step_us']:.0f} µs, busy "
        f"{row['busy_us']:.0f}, idle {row['idle_us']:.0f}, {row['kernels']:.0f} kernels ({row['source']})"
    )
    for c in ("kind", "kernels/step", "µs/step", "mean µs"):
        t.add_column(c, justify="left" if c == "kind" else "right")
    for k, v in row["kinds"].items():
        t.add_row(k, f"{v['count']:.0f}", f"{v['us']:.0f}", f"{v['mean_us']:.1f}")
    console.print(t)
    top = Table(title="top kernels")
    for c in ("kernel", "per step", "µs/step"):
        top.add_column(c, justify="left" if c == "kernel" else "right")
    for k in row["top"][:10]:
        top.add_row(k["name"], f"{k['count']:.0f}", f"{k['us']:.0f}")
    console.print(top)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help=".lt2 files")
    p.add_argument("--ctx", default="4096", help="prompt lengths: 4096,32k or 4k..32k")
    p.add_argument("--batch", default="1", help="batch sizes: 1,8")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a model setting")
    p.add_argument("--steps", type=int, default=32, help="timed steps")
    p.add_argument("--profiled", type=int, default=8, help="steps recorded by the profiler")
    p.add_argument("--warm", type=int, default=4, help="steps before the timed ones")
    p.add_argument("--prefill", action="store_true", help="also profile one prefill of the prompt")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    for f in args.files:
        if not f.is_file():
            p.error(f"no such file: {f}")
    try:
        contexts, batches = parse_lengths(args.ctx), parse_lengths(args.batch, "batch size")
        overrides = overrides_of(args)
    except (SizeError, UsageError) as e:
        p.error(str(e))
    # before the profiling, so a bad --out does not lose a finished run
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out} is a file; expected a folder (created if missing)")
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console()
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = []
    for f in args.files:
        loaded = load(f, overrides)
        if loaded.model is None:
            report(console, loaded.diagnostics, loaded.sources)
            return 2
        model = lt2dsl.compile(loaded.model, device=args.device, dtype=dtype).eval()
        for batch in batches:
            for ctx in contexts:
                row = {"model": f.stem} | point(model, batch, ctx, args)
                rows.append(row)
                show(console, f.stem, row)
                if "prefill" in row:
                    show(console, f"{f.stem} prefill", row["prefill"] | {"batch": batch, "ctx": ctx})
        del model
        if cuda:
            torch.cuda.empty_cache()
    info = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "package": str(Path(lt2dsl.__file__).resolve().parent),
        "rows": rows,
    }
    atomic_write(args.out / "decode_profile.json", json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
