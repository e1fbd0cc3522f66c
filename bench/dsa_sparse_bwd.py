"""DSA's sparse-attention backward, dK/dV by atomics against by key: ms a call and agreement.

`sparse_attn_bwd` with dK/dV added by fp32 atomics (`dkdv="atomic"`) and gathered by key
(`dkdv="by_key"`), the forward for reference, each timed by `triton.testing.do_bench`.

Shapes: the hybrid's training step (`examples/lt2_hybrid_gdn_dsa.lt2`: B=4, T=8192, 16 heads of 128,
top-k 2048, bf16) on 16 kv heads (MHA, as the hybrid) and on one (MQA). The selection is causal and
shared by the heads, as the indexer's: each query t takes the `--local` keys up to t, then random
distinct earlier keys up to top-k (every key ≤ t while t < top-k), −1 padded. The by_key row also
times its inverse index alone and both backward paths report their peak memory above the inputs.
The two paths' (dq, dk, dv) are compared by max |a − b| / max |b|; over `--tol` is an error (exit
status 1).

    python bench/dsa_sparse_bwd.py --out $OUT/dsa_sparse_bwd.json      # on the GPU
    python bench/dsa_sparse_bwd.py --kv-heads 16 --seq 4096            # one shape, shorter
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

from lt2dsl.kernels.dsa.triton_attn import sparse_attn_bwd, sparse_attn_fwd  # noqa: E402
from lt2dsl.kernels.dsa.triton_attn_bykey import inverse_index, tile_constexprs  # noqa: E402
from lt2dsl.train.files import atomic_write  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MODES = ("atomic", "by_key")


def causal_selection(B: int, T: int, topk: int, local: int, gen: torch.Generator) -> torch.Tensor:
    """`[B, T, topk]` int64: query t's last `local` keys ≤ t, then random distinct keys < t − local
    (all keys ≤ t while t < topk); −1 pads. One batch row of `[T, T]` scores at a time."""
    dev = gen.device
    t = torch.arange(T, device=dev)[:, None]
    s = torch.arange(T, device=dev)[None, :]
    rows = []
    for _ in range(B):
        score = torch.rand(T, T, generator=gen, device=dev) + 2.0 * (s > t - local)
        score = score.masked_fill(s > t, float("-inf"))
        val, idx = score.topk(topk, dim=-1)
        rows.append(idx.masked_fill(val == float("-inf"), -1))
    return torch.stack(rows)


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b| in fp32 (inf when a has a NaN or an inf)."""
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def peak_mib(fn) -> float:
    """MiB one `fn()` allocates above what was allocated before it, at its peak."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def measure(B, T, HQ, HKV, D, topk, local, dtype, gen, timer) -> dict:
    """One shape: ms a call of the forward, each backward and the inverse index; errors; memory."""
    q, k, v, do = (
        torch.randn(B, T, h, D, generator=gen, device="cuda", dtype=dtype) for h in (HQ, HKV, HKV, HQ)
    )
    idx = causal_selection(B, T, topk, local, gen)
    scale = D**-0.5
    o, lse = sparse_attn_fwd(q, k, v, idx, scale)
    row = {"B": B, "T": T, "HQ": HQ, "HKV": HKV, "D": D, "topk": topk, "local": local}
    row["valid_pairs"] = int((idx >= 0).sum().item()) * HQ
    row["fwd_ms"] = timer(lambda: sparse_attn_fwd(q, k, v, idx, scale))
    grads = {}
    for mode in MODES:
        call = lambda mode=mode: sparse_attn_bwd(do, q, k, v, o, lse, idx, scale, dkdv=mode)  # noqa: E731
        row[f"{mode}_ms"] = timer(call)
        row[f"{mode}_peak_mib"] = peak_mib(call)
        grads[mode] = call()
    bn = tile_constexprs(dtype, HQ // HKV)["BN"]
    row["index_ms"] = timer(lambda: inverse_index(idx, T, T, bn))
    for name, a, b in zip(("dq", "dk", "dv"), grads["by_key"], grads["atomic"]):
        row[f"{name}_max_rel"] = max_rel(a, b)
    row["speedup"] = row["atomic_ms"] / row["by_key_ms"]
    return row


def table(rows: list[dict], device: str, dtype: str) -> Table:
    t = Table(title=f"DSA sparse-attention backward, ms a call ({device}, {dtype})")
    for col in ("B", "T", "HQ/HKV", "top-k", "fwd", "bwd atomic", "bwd by_key", "of which index",
                "speedup", "peak MiB atomic / by_key", "max rel dq / dk / dv"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        err = " / ".join(f"{r[f'{n}_max_rel']:.1e}" for n in ("dq", "dk", "dv"))
        t.add_row(str(r["B"]), str(r["T"]), f"{r['HQ']}/{r['HKV']}", str(r["topk"]), f"{r['fwd_ms']:.2f}",
                  f"{r['atomic_ms']:.2f}", f"{r['by_key_ms']:.2f}", f"{r['index_ms']:.2f}",
                  f"{r['speedup']:.2f}x", f"{r['atomic_peak_mib']:.0f} / {r['by_key_peak_mib']:.0f}",
                  err)  # fmt: skip
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4, help="sequences B (default 4)")
    ap.add_argument("--seq", type=int, default=8192, help="tokens T, queries and keys (default 8192)")
    ap.add_argument("--heads", type=int, default=16, help="query heads (default 16)")
    ap.add_argument("--kv-heads", type=int, nargs="+", default=[16, 1], help="kv heads (default 16 1)")
    ap.add_argument("--dim", type=int, default=128, help="head dim (default 128)")
    ap.add_argument("--topk", type=int, default=2048, help="keys selected a query (default 2048)")
    ap.add_argument("--local", type=int, default=512, help="keys up to t always selected (default 512)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms (default 25)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition, ms (default 100)")
    ap.add_argument("--tol", type=float, default=2e-2, help="max relative difference (default 2e-2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    console = Console()
    if not torch.cuda.is_available():
        console.print("error: this benchmark needs a CUDA device")
        return 2
    import triton.testing

    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    device = torch.cuda.get_device_name()
    dtype = DTYPES[args.dtype]

    def timer(fn) -> float:
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep)

    rows = []
    with console.status("timing") as status:
        for hkv in args.kv_heads:
            status.update(f"timing HQ={args.heads} HKV={hkv}")
            rows.append(measure(args.batch, args.seq, args.heads, hkv, args.dim, args.topk, args.local,
                                dtype, gen, timer))  # fmt: skip
    console.print(table(rows, device, args.dtype))
    if args.out is not None:
        info = {"device": device, "torch": torch.__version__, "triton": triton.__version__,
                "dtype": args.dtype, "warmup_ms": args.warmup, "rep_ms": args.rep, "rows": rows}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out, json.dumps(info, indent=2) + "\n")
        console.print(f"wrote {args.out}")
    bad = [r for r in rows if max(r[f"{n}_max_rel"] for n in ("dq", "dk", "dv")) > args.tol]
    if bad:
        console.print(f"[red]error: by_key and atomic differ by more than {args.tol:g}[/red]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
