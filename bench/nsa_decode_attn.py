"""NSA's decode step (`kernels.nsa.triton_decode.nsa_decode_triton`) at a model's shape: the whole
call and each of its kernels, the compressed branch in one program a (row, kv head) against split.

For each (B, KW) the call runs at one query row per sequence, every row at the buffer's last slot,
over random caches (the compressed buffers full), with the compressed branch in one kernel
(`splits=1`), at `cmp_splits`' default and at each count of `--splits`. Each variant is captured as
a CUDA graph of `--calls` back-to-back calls, replayed `--reps` times between CUDA events (the
median of `--rounds` timings, µs a call); then `--profiled` eager calls run under the torch
profiler (`harness.kernel_times`), which reports each kernel's mean µs a call (CUPTI's durations:
a kernel's own time, no launch gaps; the compression, which runs on few steps, counts its share).
Every variant's output is compared with the one-kernel form's by the largest error relative to its
largest magnitude, and its attended tokens must be the same (above 1e-2, or other tokens, fails).

    python bench/nsa_decode_attn.py --kw 4160,32800 --batch 1,8 --splits 2 4 --out $OUT/nsa_attn.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dsa_decode_select import graph_time_us  # noqa: E402
from bench.harness import kernel_times  # noqa: E402
from lt2dsl.kernels.nsa import triton_decode  # noqa: E402
from lt2dsl.kernels.nsa.common import NSAGeometry  # noqa: E402
from lt2dsl.train.files import atomic_write  # noqa: E402

TOLERANCE = 1e-2


def inputs(B: int, KW: int, args, gen: torch.Generator):
    H, HKV, D = args.heads, args.kv_heads, args.head_dim
    geo = NSAGeometry.make(args.block, args.cmp_block, args.stride)
    NC = geo.n_cmp(KW)
    dev, dt = gen.device, torch.bfloat16

    def r(*shape):
        return torch.randn(*shape, device=dev, dtype=dt, generator=gen)

    q, k, v = r(B, 1, H, D), r(B, KW, HKV, D), r(B, KW, HKV, D)
    # the compressed buffers as the cache keeps them: [B, HKV, NC, d] seen through a transpose
    kc, vc = r(B, HKV, NC, D).transpose(1, 2), r(B, HKV, NC, D).transpose(1, 2)
    g = r(B, 1, H, 3)
    t = torch.full((B,), KW - 1, device=dev, dtype=torch.int64)
    geometry = dict(block=args.block, cmp_block=args.cmp_block, stride=args.stride, select=args.select,
                    window=args.window)  # fmt: skip
    return (q, k, v, g, kc, vc, t, geometry), NC


def row(B: int, KW: int, args, gen: torch.Generator) -> dict:
    call_args, NC = inputs(B, KW, args, gen)
    H, HKV = args.heads, args.kv_heads
    default = triton_decode.cmp_splits(B * HKV, NC, triton_decode.select_tile(args.head_dim), gen.device)
    variants = {"one": 1, "default": None, **{f"s{ns}": ns for ns in args.splits}}
    outs, idxs, times, kernels = {}, {}, {}, {}
    for name, ns in variants.items():

        def fn(name=name, ns=ns):
            outs[name], idxs[name] = triton_decode.nsa_decode_triton(
                *call_args, return_indices=True, splits=ns, gate_logits=True
            )

        times[name] = graph_time_us(fn, args.calls, args.reps, args.rounds)
        kernels[name] = {k["kernel"]: k["us_per_call"] for k in kernel_times(fn, args.profiled, warm=1)}
    ref = outs["one"].float()
    errs = {
        name: ((o.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        for name, o in outs.items()
    }
    same = {name: bool(torch.equal(i, idxs["one"])) for name, i in idxs.items()}
    return {"B": B, "KW": KW, "NC": NC, "heads": H, "kv_heads": HKV, "default_splits": default, "us": times,
            "kernels_us": kernels, "rel_err": errs, "same_tokens": same}  # fmt: skip


def table(rows: list[dict], device: str) -> Table:
    t = Table(title=f"NSA decode step, µs a call under a CUDA graph ({device})")
    for col in ("B", "KW", "NC", "cmp splits", "variant", "µs", "rel err", "kernels (µs, profiler)"):
        t.add_column(col, justify="right" if col != "kernels (µs, profiler)" else "left")
    for r in rows:
        for name, us in r["us"].items():
            ks = ", ".join(f"{k.removeprefix('nsa_decode_').removesuffix('_kernel')} {v:.1f}"
                           for k, v in r["kernels_us"][name].items())  # fmt: skip
            flag = "" if r["same_tokens"][name] else " (tokens differ)"
            ns = str(r["default_splits"]) if name == "default" else ""
            err = f"{r['rel_err'][name]:.1e}{flag}"
            t.add_row(str(r["B"]), str(r["KW"]), str(r["NC"]), ns, name, f"{us:.1f}", err, ks)
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,8", help="sequences B, comma-separated (default 1,8)")
    ap.add_argument("--kw", default="4160,32800", help="cache slots KW, comma-separated")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=64, help="selection block l'")
    ap.add_argument("--select", type=int, default=16, help="selected blocks n")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--cmp-block", type=int, default=32)
    ap.add_argument("--stride", type=int, default=16)
    ap.add_argument("--splits", type=int, nargs="*", default=[], help="also time these split counts")
    ap.add_argument("--calls", type=int, default=20, help="calls captured in one graph (default 20)")
    ap.add_argument("--reps", type=int, default=20, help="graph replays a timing (default 20)")
    ap.add_argument("--rounds", type=int, default=5, help="timings, the median reported (default 5)")
    ap.add_argument("--profiled", type=int, default=20, help="calls under the profiler a variant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write every row as JSON here")
    args = ap.parse_args(argv)
    console = Console(width=160)
    if not torch.cuda.is_available():
        console.print("error: this benchmark needs a CUDA device")
        return 2
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    device = torch.cuda.get_device_name()
    rows = [row(int(B), int(KW), args, gen) for B in args.batch.split(",") for KW in args.kw.split(",")]
    console.print(table(rows, device))
    if args.out is not None:
        info = {"device": device, "torch": torch.__version__, "args": vars(args), "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out, json.dumps(info, indent=2, default=str) + "\n")
        console.print(f"wrote {args.out}")
    bad = [r for r in rows if max(r["rel_err"].values()) > TOLERANCE or not all(r["same_tokens"].values())]
    if bad:
        console.print(f"[red]error: a variant's output differs from the one-kernel form by more than "
                      f"{TOLERANCE}, or its tokens do[/red]")  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
