"""Does prefetching a projection's weight into L2 during the small kernels before it make the
projection faster? The pattern of the opt-in rule `l2_prefetch`, at a model's decode shapes, under
CUDA graphs (GPU only).

Each timed call is one link of a decode step's chain: `window` small kernels (the residual
add-RMSNorm of a `[M, dim]` row block, ~2 µs each on an H100: what runs between two projections),
then the projection `F.linear(x, W_i)` (cuBLAS), over enough weight copies W_i that none is in L2
when its turn comes (as in a step, which reads each weight once). Three forms per (projection,
window, M):

* `window`: the small kernels alone;
* `cold`: window, then the projection (today's step);
* `prefetched`: a side stream waits for the previous link and prefetches W_i into L2
  (`kernels.prefetch.l2_prefetch`, at most `--max-mb`) while the window runs, then the projection.

The projection's cost is `cold − window` and `prefetched − window`; GB/s = its weight's bytes over
that. Rows for M = 1 and 8, windows of 0, 1, 2, 4 and 8 kernels.

Usage: PYTHONPATH=. python bench/l2_prefetch.py [examples/lt2_hybrid_gdn_dsa.lt2] [--out DIR]
Prints a rich table and writes DIR/l2_prefetch.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.decode_gemv import n_copies, shapes, time_us, weights  # noqa: E402

WINDOWS = (0, 1, 2, 4, 8)
ROWS = (1, 8)


def link_times(N: int, K: int, M: int, window: int, max_bytes: int) -> dict:
    """µs per link of the three forms (see the module docstring)."""
    from lt2dsl.kernels import fused
    from lt2dsl.kernels.prefetch import l2_prefetch

    c = n_copies((N, K))
    ws = weights(N, K, c)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    gamma = torch.ones(K, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def small():
        for _ in range(window):
            fused.add_rmsnorm(h, x, gamma, 1e-6)

    def cold(i):
        small()
        F.linear(x, ws[i])

    def prefetched(i):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            l2_prefetch(ws[i], max_bytes)
        small()
        F.linear(x, ws[i])
        torch.cuda.current_stream().wait_stream(side)

    return {
        "window_us": time_us(lambda i: small(), c) if window else 0.0,
        "cold_us": time_us(cold, c),
        "prefetched_us": time_us(prefetched, c),
    }


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", default=str(ROOT / "examples" / "lt2_hybrid_gdn_dsa.lt2"))
    p.add_argument("--max-mb", type=float, default=24.0, help="MB prefetched per weight at most [24]")
    p.add_argument("--out", type=Path, default=Path("."), help="folder of l2_prefetch.json [.]")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: bench/l2_prefetch.py times CUDA kernels; no CUDA device is available")
    max_bytes = int(args.max_mb * 2**20)
    rows = []
    for name, (N, K) in shapes(args.model).items():
        for M in ROWS:
            for window in WINDOWS:
                r = {"proj": name, "N": N, "K": K, "M": M, "window": window, "bytes": 2 * N * K}
                r |= link_times(N, K, M, window, max_bytes)
                r["cold_proj_us"] = r["cold_us"] - r["window_us"]
                r["prefetched_proj_us"] = r["prefetched_us"] - r["window_us"]
                rows.append(r)
    card = torch.cuda.get_device_name()
    t = Table(title=f"projection after `window` small kernels, cold vs prefetched into L2, {card}, bf16")
    cols = ("proj", "M", "MB", "window", "window µs", "cold µs", "prefetched µs", "link speedup", "proj GB/s")
    for col in cols:
        t.add_column(col, justify="left" if col == "proj" else "right")
    for r in rows:
        gbps = [r["bytes"] / max(r[k], 1e-3) / 1e3 for k in ("cold_proj_us", "prefetched_proj_us")]
        t.add_row(r["proj"], str(r["M"]), f"{r['bytes'] / 1e6:.1f}", str(r["window"]),
                  *(f"{r[k]:.1f}" for k in ("window_us", "cold_us", "prefetched_us")),
                  f"{r['cold_us'] / r['prefetched_us']:.2f}x", f"{gbps[0]:.0f} → {gbps[1]:.0f}")  # fmt: skip
    Console().print(t)
    info = {"device": card, "torch": torch.__version__, "max_bytes": max_bytes, "model": args.model}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "l2_prefetch.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**info, "rows": rows}, indent=1))
    os.replace(tmp, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
