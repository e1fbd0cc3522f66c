"""DSA's sparse attention at a decode step: one program a (sequence, kv head) against the split
forward (each selection over several programs, partials merged by lse), per call and whole-model.

1. Kernel rows: `sparse_attn_fwd(..., splits=1)` against the default (`split_count`) at one query
   row per sequence over a cache of KW slots, the top-k selection a random set of distinct live
   slots. Each path is captured as a CUDA graph of `--calls` back-to-back calls, replayed `--reps`
   times between CUDA events; the figure is the median of `--rounds` timings over the calls. The
   two outputs are compared by their largest error relative to the output's largest magnitude
   (float32 accumulation both ways: they differ by rounding alone; above 1e-2 the run fails).
2. Model rows (`--model FILE`): `lt2dsl bench decode`'s measurement (`lt2dsl.engine.bench.run`)
   of the model at `--ctx` and `--batch`, once with the default and once with every selection in
   one program, in this process on this card.

    python bench/dsa_decode_attn.py --model examples/lt2_hybrid_gdn_dsa.lt2 --out $OUT/dsa_attn.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lt2dsl  # noqa: E402
from bench.dsa_decode_select import graph_time_us  # noqa: E402
from lt2dsl.cost.hardware import load_hardware  # noqa: E402
from lt2dsl.engine import bench  # noqa: E402
from lt2dsl.kernels.dsa import triton_attn  # noqa: E402
from lt2dsl.train.files import atomic_write  # noqa: E402

TOLERANCE = 1e-2


def selection(B: int, KW: int, topk: int, gen: torch.Generator) -> torch.Tensor:
    """`[B, 1, topk]` int32: distinct slots of 0 … KW − 1, sorted (the live cache is the whole buffer)."""
    rows = [torch.randperm(KW, generator=gen, device=gen.device)[:topk].sort().values for _ in range(B)]
    return torch.stack(rows)[:, None].to(torch.int32)


def kernel_row(B: int, KW: int, args, gen: torch.Generator) -> dict:
    H, HKV, D = args.heads, args.kv_heads, args.head_dim
    dev, dt = gen.device, torch.bfloat16
    q = torch.randn(B, 1, H, D, device=dev, dtype=dt, generator=gen)
    k = torch.randn(B, KW, HKV, D, device=dev, dtype=dt, generator=gen)
    v = torch.randn(B, KW, HKV, D, device=dev, dtype=dt, generator=gen)
    idx = selection(B, KW, args.topk, gen)
    scale = D**-0.5
    splits = triton_attn.split_count(B * HKV, args.topk, triton_attn._launch(q, k, v, idx)["BK"], dev)
    outs = {}

    def call(name: str, ns: int | None):
        def fn():
            outs[name] = triton_attn.sparse_attn_fwd(q, k, v, idx, scale, splits=ns)[0]

        return fn

    def timer(fn) -> float:
        return graph_time_us(fn, args.calls, args.reps, args.rounds)

    one_us, split_us = timer(call("one", 1)), timer(call("split", None))
    ref = outs["one"].float()
    err = ((outs["split"].float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    # other split counts (`--splits`), each checked against one program as the default is
    other = {}
    for ns in args.splits:
        other[ns] = timer(call(f"s{ns}", ns))
        err = max(err, ((outs[f"s{ns}"].float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item())
    return {"B": B, "KW": KW, "topk": args.topk, "splits": splits, "one_us": one_us, "split_us": split_us,
            "speedup": one_us / split_us, "rel_err": err, "splits_us": other}  # fmt: skip


@contextlib.contextmanager
def unsplit():
    """Every selection in one program (`split_count` → 1) while inside."""
    saved = triton_attn.split_count
    triton_attn.split_count = lambda *a, **k: 1
    try:
        yield
    finally:
        triton_attn.split_count = saved


def model_rows(path: Path, args) -> list[dict]:
    model = lt2dsl.compile(path, device="cuda", dtype=torch.bfloat16).eval()
    ctx = tuple(int(c) for c in args.ctx.split(","))
    batches = tuple(int(b) for b in args.batch.split(","))
    plan = bench.Plan(ctx, batches, args.steps, 4, load_hardware(args.hw))
    rows = []
    for variant, scope in (("split", contextlib.nullcontext), ("one", unsplit)):
        with scope():

            def progress(what: str, variant: str = variant) -> None:
                print(f"{variant}: {what}", file=sys.stderr, flush=True)

            for r in bench.run([(path.stem, model)], plan, progress):
                rows.append({"variant": variant, **r})
    return rows


def kernel_table(rows: list[dict], device: str) -> Table:
    t = Table(title=f"DSA sparse attention at decode, µs a call under a CUDA graph ({device})")
    cols = ("B", "KW", "top-k", "splits", "one program", "split + combine", "speedup", "rel err", "--splits")
    for col in cols:
        t.add_column(col, justify="right")
    for r in rows:
        other = ", ".join(f"{ns}: {us:.1f}" for ns, us in r["splits_us"].items())
        t.add_row(str(r["B"]), str(r["KW"]), str(r["topk"]), str(r["splits"]), f"{r['one_us']:.1f}",
                  f"{r['split_us']:.1f}", f"{r['speedup']:.2f}x", f"{r['rel_err']:.1e}", other)  # fmt: skip
    return t


def model_table(rows: list[dict], device: str) -> Table:
    t = Table(title=f"whole-model decode, tok/s ({device})")
    for col in ("model", "B", "ctx", "split", "one program", "split / one"):
        t.add_column(col, justify="right")
    by = {(r["variant"], r["batch"], r["ctx"]): r for r in rows}
    for (variant, B, L), r in by.items():
        o = by.get(("one", B, L))
        if variant != "split" or o is None:
            continue
        if r.get("oom") or o.get("oom"):
            t.add_row(r["model"], str(B), str(L), "oom", "oom", "-")
            continue
        a, b = r["tok_s"], o["tok_s"]
        t.add_row(r["model"], str(B), str(L), f"{a:.1f}", f"{b:.1f}", f"{a / b:.3f}")
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,8", help="sequences B, comma-separated (default 1,8)")
    ap.add_argument("--kw", default="4096,32768,131072", help="cache slots KW of the kernel rows")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--splits", type=int, nargs="*", default=[], help="also time these split counts")
    ap.add_argument("--calls", type=int, default=20, help="calls captured in one graph (default 20)")
    ap.add_argument("--reps", type=int, default=20, help="graph replays a timing (default 20)")
    ap.add_argument("--rounds", type=int, default=5, help="timings, the median reported (default 5)")
    ap.add_argument("--model", type=Path, default=None, help="also time this .lt2 model's decode both ways")
    # a cold machine spends minutes compiling and tuning the prefill of a new context: one context
    ap.add_argument("--ctx", default="4096", help="model rows' contexts, comma-separated (default 4096)")
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps of a model row")
    ap.add_argument("--hw", default="h100", help="estimate preset of the card [h100]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write every row as JSON here")
    args = ap.parse_args(argv)
    console = Console(width=140)
    if not torch.cuda.is_available():
        console.print("error: this benchmark needs a CUDA device")
        return 2
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    device = torch.cuda.get_device_name()
    shapes = [(int(B), int(KW)) for B in args.batch.split(",") for KW in args.kw.split(",")]
    krows = [kernel_row(B, KW, args, gen) for B, KW in shapes]
    console.print(kernel_table(krows, device))
    mrows = model_rows(args.model, args) if args.model is not None else []
    if mrows:
        console.print(model_table(mrows, device))
    if args.out is not None:
        info = {"device": device, "torch": torch.__version__, "kernel": krows, "model": mrows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out, json.dumps(info, indent=2, default=str) + "\n")
        console.print(f"wrote {args.out}")
    bad = [r for r in krows if not r["rel_err"] <= TOLERANCE]
    if bad:
        console.print(f"[red]error: split and one-program outputs differ by more than {TOLERANCE}[/red]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
