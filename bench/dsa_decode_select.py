"""DSA's decode-step top-k select: one program a row (`_select_single`) against the sliced select
(`select_topk_split`), the same outputs, times per call under a CUDA graph.

A decode step selects the top-k of one query row per sequence over a static key buffer of KW slots,
row b's candidates the slots 0 … positions[b]. The keys are what the indexer writes: the ordered
32-bit keys of float scores (here standard normal). Row 0 sits at the buffer's last slot (the whole
row is live), the others at random positions in the buffer's second half. Each path is captured
as a CUDA graph of `--calls` back-to-back calls, replayed `--reps` times between CUDA events; the
figure is the median over `--rounds` such timings divided by the calls. The two paths' outputs
are compared with `torch.equal` on every shape (a mismatch is an error, exit status 1).

    python bench/dsa_decode_select.py --out $OUT/dsa_decode_select.json      # on the GPU
    python bench/dsa_decode_select.py --kw 4160 6144 --slice-len 512 1024     # slice lengths too
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lt2dsl.kernels.dsa.triton_topk import (  # noqa: E402
    _select_single,
    select_topk_split,
    split_slices,
    use_split,
)
from lt2dsl.train.files import atomic_write  # noqa: E402

LAUNCHES = {"single": 1, "split": 5}


def ordered_keys(B: int, KW: int, gen: torch.Generator) -> torch.Tensor:
    """`[B, 1, KW]` int32 storage of the unsigned order-preserving keys of standard normal scores."""
    bits = torch.randn(B, 1, KW, generator=gen, device=gen.device).view(torch.int32)
    return torch.where(bits < 0, ~bits, bits ^ torch.iinfo(torch.int32).min)


def row_positions(B: int, KW: int, gen: torch.Generator) -> torch.Tensor:
    """`[B]` int64: row 0 at the last slot, the others in the buffer's second half."""
    pos = torch.randint(KW // 2, KW, (B,), generator=gen, device=gen.device)
    pos[0] = KW - 1
    return pos


def graph_time_us(fn, calls: int, reps: int, rounds: int) -> float:
    """Median µs of one `fn()` inside a CUDA graph of `calls` calls replayed `reps` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (reps * calls))
    return statistics.median(times)


def measure(B: int, KW: int, topk: int, gen: torch.Generator, timer, slice_lens=()) -> dict:
    """One shape: both paths' µs a call (`timer(fn)`) and whether their outputs are equal; the
    split path also at each of `slice_lens` keys a slice (`split_at`: SL → µs), equal outputs too."""
    keys, pos = ordered_keys(B, KW, gen), row_positions(B, KW, gen)
    outs = {name: keys.new_empty(B, 1, topk, dtype=torch.long) for name in LAUNCHES}
    calls = {
        "single": lambda: _select_single(keys, outs["single"], 0, KW, topk, pos),
        "split": lambda: select_topk_split(keys, outs["split"], 0, KW, topk, pos),
    }
    row = {"B": B, "KW": KW, "topk": topk, "slices": split_slices(KW, B)[1], "select_topk": "single"}
    if use_split(B, KW):
        row["select_topk"] = "split"
    for name, fn in calls.items():
        row[f"{name}_us"] = timer(fn)
    for fn in calls.values():
        fn()
    row["equal"] = bool(torch.equal(outs["single"], outs["split"]))
    row["split_at"] = {}
    for sl in slice_lens:
        out = torch.empty_like(outs["split"])
        fn = lambda out=out, sl=sl: select_topk_split(keys, out, 0, KW, topk, pos, slice_len=sl)  # noqa: E731
        row["split_at"][sl] = timer(fn)
        fn()
        row["equal"] &= bool(torch.equal(outs["single"], out))
    row["speedup"] = row["single_us"] / row["split_us"]
    return row


def table(rows: list[dict], device: str) -> Table:
    t = Table(title=f"DSA decode select, µs a call under a CUDA graph ({device})")
    for col in ("B", "KW", "top-k", "slices", "single (1 launch)", "split (5 launches)", "speedup",
                "select_topk takes", "equal"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["B"]), str(r["KW"]), str(r["topk"]), str(r["slices"]), f"{r['single_us']:.1f}",
                  f"{r['split_us']:.1f}", f"{r['speedup']:.2f}x", r["select_topk"],
                  "yes" if r["equal"] else "[red]NO[/red]")  # fmt: skip
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="sequences B (default 1 8)")
    ap.add_argument("--kw", type=int, nargs="+", default=[4096, 32768, 131072], help="key slots KW")
    ap.add_argument("--topk", type=int, default=2048, help="selected keys (default 2048)")
    ap.add_argument("--calls", type=int, default=20, help="calls captured in one graph (default 20)")
    ap.add_argument("--reps", type=int, default=20, help="graph replays a timing (default 20)")
    ap.add_argument("--rounds", type=int, default=5, help="timings, the median reported (default 5)")
    ap.add_argument("--slice-len", type=int, nargs="*", default=[], help="also time the split at these SL")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    console = Console()
    if not torch.cuda.is_available():
        console.print("error: this benchmark needs a CUDA device")
        return 2
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    device = torch.cuda.get_device_name()
    rows = []

    def timer(fn) -> float:
        return graph_time_us(fn, args.calls, args.reps, args.rounds)

    with console.status("timing") as status:
        for B in args.batch:
            for KW in args.kw:
                status.update(f"timing B={B} KW={KW}")
                rows.append(measure(B, KW, args.topk, gen, timer, args.slice_len))
    console.print(table(rows, device))
    for r in rows:
        if r["split_at"]:
            at = ", ".join(f"SL {sl}: {us:.1f}" for sl, us in r["split_at"].items())
            console.print(f"B={r['B']} KW={r['KW']} split µs at {at}")
    if args.out is not None:
        info = {"device": device, "torch": torch.__version__, "launches": LAUNCHES, "calls": args.calls,
                "reps": args.reps, "rounds": args.rounds, "rows": rows}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out, json.dumps(info, indent=2) + "\n")
        console.print(f"wrote {args.out}")
    if not all(r["equal"] for r in rows):
        console.print("[red]error: the two paths' outputs differ[/red]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
