"""One forward of ours and one of the peer's, for Nsight Compute: where do the scan's cycles go?

The GDN forward's state scan takes 512 µs here against the peer's 207 (BENCHMARKS.md, delta
family): both are latency-bound sequential loops, so their warp stall reasons say more than their
timings. This runs each op (`OP`: gdn, deltanet or kda; B=4, T=8192, H=16, D=128, bf16) a few times
to compile and autotune, then once each between `cudaProfilerStart`/`Stop`, so that

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
        --section Occupancy --section LaunchStats --csv --page details python3 bench/ncu_pair.py

profiles exactly those launches (`ncu_pair` stage of bench/gpu_session.sh). Without the peer
installed it profiles ours alone. SMOKE=1 runs it on a tiny CPU shape under the interpreter.
BWD=1 profiles one forward+backward of each instead: the backward kernels' counters (is the
per-chunk gradient kernel bound by DRAM, L2 or its own instruction stream?).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.kernels_delta import SMOKE, _inputs, _ours, _peer_chunk


def main() -> None:
    op = os.environ.get("OP", "gdn")
    B, T = (1, 100) if SMOKE else (4, 8192)
    cuda = torch.cuda.is_available() and not SMOKE
    bwd = os.environ.get("BWD", "0") == "1"
    x = _inputs(op, B, T, grad=bwd)
    peer = _peer_chunk(op)
    runs = [("lt2dsl", lambda: _ours(op, x))] + ([("fla", lambda: peer(x))] if peer else [])
    do = None

    def once(fn):
        nonlocal do
        out = fn()
        out = out[0] if isinstance(out, tuple | list) else out
        if bwd:
            do = torch.randn_like(out) if do is None else do
            out.backward(do)
            for t in x.values():
                if t is not None:
                    t.grad = None

    with torch.set_grad_enabled(bwd):
        for _ in range(3):
            for _, fn in runs:
                once(fn)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        for _, fn in runs:
            once(fn)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    mode = "fwd+bwd" if bwd else "fwd"
    print("profiled:", ", ".join(name for name, _ in runs), f"({op} {mode} B={B} T={T})")


if __name__ == "__main__":
    main()
