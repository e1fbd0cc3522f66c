"""GPU kernel benchmark: every lt2dsl op next to the peer (fla) and torch, in one run.

    PYTHONPATH=. python bench/kernel_times.py [--only delta,decay,attn]

Each family module (`bench/kernels_<family>.py`) exposes `cases() -> list[harness.Case]` and
reads its own size knobs from the environment (see each module's docstring).
Ceilings (copy bandwidth, bf16 matmul) are measured first in the same process; a table of ms,
ratio to the peer, achieved FLOP/s and bandwidth is printed last and every figure goes to
`$OUT/kernels.json`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import measure_ceilings, run_cases, summary_table, versions

FAMILIES = ("delta", "decay", "attn")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(FAMILIES))
    args = p.parse_args()
    ceil = measure_ceilings()
    print(
        f"ceilings: copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['bf16_TFLOPs']:.0f} TFLOP/s",
        flush=True,
    )
    rows = []
    for fam in args.only.split(","):
        mod = importlib.import_module(f"bench.kernels_{fam}")
        rows += run_cases(f"kernels_{fam}", mod.cases(), ceil)
    print()
    print(versions())
    print(summary_table(rows))


if __name__ == "__main__":
    main()
