"""The mLSTM GPU test `test_gpu_full_size[8192-128-bf16-xlstm]` (B=2, T=8192, H=16, D=128, bf16,
final state outside the loss) run through Triton's CPU interpreter, one (batch, head) slice at a
time (heads are independent), against the same float64 chunked reference: what the kernels' bf16
roundings alone give, to tell a precision shortfall from a GPU-side fault. Slow (~80 s a slice);
split over processes with `python3 bench/mlstm_cpu_emulation.py WORKER WORKERS`, then
`python3 bench/mlstm_cpu_emulation.py summary WORKERS` adds the slices up.

    TRITON_INTERPRET=1 python3 bench/mlstm_cpu_emulation.py 0 2 &
    TRITON_INTERPRET=1 python3 bench/mlstm_cpu_emulation.py 1 2; wait
    python3 bench/mlstm_cpu_emulation.py summary 2     # reads mlstm_emulation_<w>.json in $OUT (".")
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

NAMES = ["h", "dq", "dk", "dv", "di", "df"]
B, H, D = 2, 16, 128
T = int(os.environ.get("T", "8192"))  # the GPU test's; smaller for a quick look


def _path(w: int) -> str:
    return os.path.join(os.environ.get("OUT", "."), f"mlstm_emulation_{w}.json")


def fwd_bwd(backend: str, leaves, dh) -> list:
    """The GPU test's call: (h, dq, dk, dv, dĩ, df̃) of `mlstm` on leaves (q, k, v, i, f, C, n, m)
    with upstream gradient dh, the final state outside the loss."""
    from lt2dsl.kernels import mlstm

    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    q, k, v, i, f, C, n, m = leaves
    o, _ = mlstm(q, k, v, i, f, initial_state=(C, n, m), backend=backend, eps=1e-6, output_final_state=True)
    (o.double() * dh).sum().backward()
    return [o.detach()] + [t.grad for t in leaves[:5]]


def run_slices(worker: int, workers: int) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from tests.kernels.test_mlstm import _inputs  # the GPU test's own inputs

    x, s0 = _inputs(B, T, H, D, D, torch.bfloat16, "xlstm", device="cpu")
    dh = torch.randn(*x[2].shape, generator=torch.Generator().manual_seed(11), dtype=torch.float64)

    out = {}
    for idx in range(worker, B * H, workers):
        b, h = divmod(idx, H)
        sl = [t[b : b + 1, :, h : h + 1].contiguous() for t in x] + [
            t[b : b + 1, h : h + 1].contiguous() for t in s0
        ]
        dhs = dh[b : b + 1, :, h : h + 1].contiguous()
        t0 = time.time()
        got, ref = fwd_bwd("triton", sl, dhs), fwd_bwd("reference", [t.double() for t in sl], dhs)
        # per tensor: squared error, squared reference, max |error|
        out[idx] = {
            n: [
                ((u.double() - r) ** 2).sum().item(),
                (r**2).sum().item(),
                (u.double() - r).abs().max().item(),
            ]
            for n, u, r in zip(NAMES, got, ref)
        }
        e = out[idx]["dq"]
        print(
            f"b={b} h={h}: dq {(e[0] / e[1]) ** 0.5:.2e}, max |err| {e[2]:.2e} ({time.time() - t0:.0f} s)",
            flush=True,
        )
        with open(_path(worker), "w") as fh:
            json.dump(out, fh)


def summary(workers: int) -> None:
    d = {}
    for w in range(workers):
        with open(_path(w)) as fh:
            d.update(json.load(fh))
    print(f"{len(d)} of {B * H} slices")
    for n in NAMES:
        se, sr = sum(v[n][0] for v in d.values()), sum(v[n][1] for v in d.values())
        print(
            f"{n:3s} relative RMS {(se / sr) ** 0.5:.3e}   max |error| {max(v[n][2] for v in d.values()):.2e}"
        )


if __name__ == "__main__":
    if sys.argv[1] == "summary":
        summary(int(sys.argv[2]))
    else:
        run_slices(int(sys.argv[1]), int(sys.argv[2]))
