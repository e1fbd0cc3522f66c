"""mLSTM output-kernel configs on the H200: repeated correctness of h and forward time, per config.

The output kernel at 4 warps, 2 stages gave wrong outputs in some runs (ninth session), and the
8-warp, 3-stage config that replaced it costs ~0.1 ms of the forward; the tenth session added the
128-wide value tile (`chunk.O_BV_CAP`). For each candidate (warps, stages, value-tile cap) this runs
the GPU test's forward (B=2, T=8192, H=16, D=128, bf16, xLSTM gates) `REPS` times against the
float64 reference (relative RMS and max |error| of h, each run), then times `mlstm`'s forward at
B=4, T=8192 with only that config.

    PYTHONPATH=. OUT=$OUT python3 bench/mlstm_o_configs.py     # writes $OUT/mlstm_o_configs.json
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CANDIDATES = [(8, 3, 64), (8, 3, 128), (8, 2, 128), (4, 2, 128), (4, 3, 128)]


def main() -> None:
    import triton
    from triton.testing import do_bench

    from lt2dsl.kernels import mlstm
    from lt2dsl.kernels.mlstm import chunk
    from tests.kernels.test_mlstm import _inputs

    reps = int(os.environ.get("REPS", "6"))
    x, s0 = _inputs(2, 8192, 16, 128, 128, torch.bfloat16, "xlstm", device="cuda")

    def fwd(backend, args, state):
        with torch.no_grad():
            o, _ = mlstm(*args, initial_state=state, backend=backend, eps=1e-6, output_final_state=True)
        return o

    ref = fwd("reference", [t.double() for t in x], tuple(s.double() for s in s0))
    xb, sb = _inputs(4, 8192, 16, 128, 128, torch.bfloat16, "xlstm", device="cuda")
    at = chunk.fwd_o_kernel
    rows = []
    for w, s, bv in CANDIDATES:
        chunk.O_BV_CAP = bv
        at.configs = [triton.Config({}, num_warps=w, num_stages=s)]
        at.cache.clear()
        errs = []
        for _ in range(reps):
            d = fwd("triton", x, s0).double() - ref
            errs.append(((d.norm() / ref.norm()).item(), d.abs().max().item()))
        ms = do_bench(lambda: fwd("triton", xb, sb), warmup=25, rep=100, return_mode="median")
        worst = max(e[1] for e in errs)
        per_run = " ".join(f"{e[1]:.2f}" for e in errs)
        print(f"w{w}s{s} BV{bv}: fwd {ms:.3f} ms; h max |err| per run {per_run}"
              + f" (worst {worst:.2f}; rel RMS {max(e[0] for e in errs):.2e})", flush=True)  # fmt: skip
        rows.append({"warps": w, "stages": s, "bv_cap": bv, "fwd_ms": ms, "errors": errs})
        with open(os.path.join(os.environ.get("OUT", "."), "mlstm_o_configs.json"), "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
