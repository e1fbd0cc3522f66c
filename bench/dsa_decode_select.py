"""DSA's decode-step top-k select, each path's µs a call under a CUDA graph and their outputs equal:
one program a row by histograms (`_select_single`), the sliced select (`select_topk_split`, five
launches), the row in registers by bisection (`select_topk_rows`, one launch, at `--row-warps`) and
slices by bisection then their candidates merged (`select_topk_merge`, two launches, slices of
`--merge-slice` keys).

A decode step selects the top-k of one query row per sequence over a static key buffer of KW slots,
row b's candidates the slots 0 … positions[b]. The keys are what the indexer writes: the ordered
32-bit keys of float scores (here standard normal). Row 0 sits at the buffer's last slot (the whole
row is live), the others at random positions in the buffer's second half. Each path is captured
as a CUDA graph of `--calls` back-to-back calls, replayed `--reps` times between CUDA events; the
figure is the median over `--rounds` such timings divided by the calls. The two paths' outputs
are compared with `torch.equal` on every shape (a mismatch is an error, exit status 1).

    python bench/dsa_decode_select.py --out $OUT/dsa_decode_select.json      # on the GPU
    python bench/dsa_decode_select.py --kw 4160 6144 --slice-len 512 1024     # slice lengths too
    python bench/dsa_decode_select.py --kw 4160 32800 --row-warps 8 16 --merge-slice 2048 4096
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lt2dsl.kernels.dsa.triton_topk import (  # noqa: E402
    MAX_TILE_KEYS,
    _select_single,
    select_path,
    select_topk_merge,
    select_topk_rows,
    select_topk_split,
    split_slices,
)
from lt2dsl.train.files import atomic_write  # noqa: E402

LAUNCHES = {"single": 1, "split": 5, "rows": 1, "merge": 2}


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


def paths(keys, pos, topk: int, row_warps=(), merge_slices=()) -> dict:
    """name → a call that writes that path's selection into the `out` it is given."""
    B, _, KW = keys.shape
    calls = {
        "single": lambda out: _select_single(keys, out, 0, KW, topk, pos),
        "split": lambda out: select_topk_split(keys, out, 0, KW, topk, pos),
    }
    p2 = triton.next_power_of_2
    for w in row_warps if p2(KW) <= MAX_TILE_KEYS else ():
        calls[f"rows w{w}"] = lambda out, w=w: select_topk_rows(keys, out, 0, KW, topk, pos, num_warps=w)
    for sl in [sl for sl in merge_slices if p2(triton.cdiv(KW, sl)) * p2(topk) <= MAX_TILE_KEYS]:
        for w in row_warps or (None,):
            calls[f"merge {sl} w{w}"] = lambda out, sl=sl, w=w: select_topk_merge(
                keys, out, 0, KW, topk, pos, slice_len=sl, num_warps=w
            )
    return calls


def measure(B: int, KW: int, topk: int, gen: torch.Generator, timer, slice_lens=(), row_warps=(),
            merge_slices=()) -> dict:  # fmt: skip
    """One shape: every path's µs a call (`timer(fn)`, `us`: name → µs) and whether all outputs equal
    the one-program select's; the split path also at each of `slice_lens` keys a slice (`split_at`)."""
    keys, pos = ordered_keys(B, KW, gen), row_positions(B, KW, gen)
    calls = paths(keys, pos, topk, row_warps, merge_slices)
    for sl in slice_lens:
        calls[f"split {sl}"] = lambda out, sl=sl: select_topk_split(keys, out, 0, KW, topk, pos, slice_len=sl)
    row = {"B": B, "KW": KW, "topk": topk, "slices": split_slices(KW, B)[1]}
    row["select_topk"] = select_path(B, KW, topk)
    outs = {name: keys.new_empty(B, 1, topk, dtype=torch.long) for name in calls}
    row["us"] = {name: timer(lambda fn=fn, out=outs[name]: fn(out)) for name, fn in calls.items()}
    for name, fn in calls.items():
        outs[name].fill_(7)
        fn(outs[name])
    row["differ"] = [name for name in calls if not torch.equal(outs[name], outs["single"])]
    row["equal"] = not row["differ"]
    row["speedup"] = row["us"]["single"] / row["us"]["split"]
    return row


def table(rows: list[dict], device: str) -> Table:
    names = list(dict.fromkeys(n for r in rows for n in r["us"]))
    t = Table(title=f"DSA decode select, µs a call under a CUDA graph ({device})")
    for col in ("B", "KW", "top-k", *names, "select_topk takes", "equal"):
        t.add_column(col, justify="right")
    for r in rows:
        us = [f"{r['us'][n]:.1f}" if n in r["us"] else "-" for n in names]
        t.add_row(str(r["B"]), str(r["KW"]), str(r["topk"]), *us, r["select_topk"],
                  "yes" if r["equal"] else f"[red]NO: {', '.join(r['differ'])}[/red]")  # fmt: skip
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="sequences B (default 1 8)")
    ap.add_argument("--kw", type=int, nargs="+", default=[4096, 32768, 131072], help="key slots KW")
    ap.add_argument("--topk", type=int, nargs="+", default=[2048], help="selected keys (default 2048)")
    ap.add_argument("--row-warps", type=int, nargs="*", default=[], help="rows path at these warps")
    ap.add_argument("--merge-slice", type=int, nargs="*", default=[], help="merge path at these SL")
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
        for topk in args.topk:
            for B in args.batch:
                for KW in args.kw:
                    status.update(f"timing B={B} KW={KW} top-k {topk}")
                    row = measure(B, KW, topk, gen, timer, args.slice_len, args.row_warps, args.merge_slice)
                    rows.append(row)
    console.print(table(rows, device))
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
