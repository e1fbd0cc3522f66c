"""A/B of the mLSTM scans' weight kernels in one process: neither scan, the backward's dh scan
only, both (`chunk.PREW`, `chunk.DH_PREW`; LT2_MLSTM_PREW=0 / bwd / 1), interleaved over rounds
with `simple_gla` at the same shape (B=4, T=8192, H=16, D=128, bf16), so clock drift between
processes does not decide it. Each mode's outputs and gradients are checked equal to mode 0's
within bf16 noise (3e-2 relative: two bf16-grade results).

    python3 bench/mlstm_prew_ab.py    # writes mlstm_prew_ab.json to $OUT (default ".")
"""

from __future__ import annotations

import json
import os
import statistics

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from lt2dsl.kernels import mlstm, simple_gla
from lt2dsl.kernels.mlstm import chunk

MODES = {"0": (False, False), "bwd": (False, True), "1": (True, True)}


def main() -> None:
    B, T, H, D = 4, 8192, 16, 128
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, device="cuda", generator=g)

    q, k, v = (rnd(B, T, H, D).bfloat16().requires_grad_() for _ in range(3))
    i, f = rnd(B, T, H).requires_grad_(), (rnd(B, T, H) + 3).requires_grad_()
    gs = F.logsigmoid(rnd(B, T, H) + 4).requires_grad_()
    do = rnd(B, T, H, D).bfloat16()

    def run_mlstm(bwd):
        o = mlstm(q, k, v, i, f, backend="triton")[0]
        if bwd:
            o.backward(do)
        return o

    def run_sgla(bwd):
        o = simple_gla(q, k, v, gs, backend="triton")[0]
        if bwd:
            o.backward(do)
        return o

    ref = None
    for mode, (prew, dh) in MODES.items():
        chunk.PREW, chunk.DH_PREW = prew, dh
        for x in (q, k, v, i, f):
            x.grad = None
        out = [run_mlstm(True).float()] + [x.grad.float() for x in (q, k, v, i, f)]
        if ref is None:
            ref = out
        err = max(((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(out, ref))
        print(f"mode {mode:3s}: max relative difference to mode 0 {err:.1e}", flush=True)
        # two bf16-grade results (each checked against float64 by the GPU tests) differ by their sum
        assert err < 3e-2, (mode, err)
    times: dict[str, list[float]] = {}
    for _ in range(3):
        for mode, (prew, dh) in MODES.items():
            chunk.PREW, chunk.DH_PREW = prew, dh
            for bwd in (False, True):
                name = f"mlstm {mode} {'fwd+bwd' if bwd else 'fwd'}"
                times.setdefault(name, []).append(
                    do_bench(lambda bwd=bwd: run_mlstm(bwd), return_mode="median")
                )
        for bwd in (False, True):
            name = f"simple_gla {'fwd+bwd' if bwd else 'fwd'}"
            times.setdefault(name, []).append(
                do_bench(lambda bwd=bwd: run_sgla(bwd), grad_to_none=[q, k, v, gs], return_mode="median")
            )
    rows = {n: statistics.median(t) for n, t in times.items()}
    for n, ms in rows.items():
        base = rows["simple_gla " + n.split()[-1]]
        print(
            f"{n:24s} {ms:8.3f} ms   {ms / base:5.2f}x simple_gla   rounds {[round(x, 3) for x in times[n]]}"
        )
    with open(os.path.join(os.environ.get("OUT", "."), "mlstm_prew_ab.json"), "w") as fh:
        json.dump({"shape": dict(B=B, T=T, H=H, D=D), "ms": rows, "rounds": times}, fh, indent=1)


if __name__ == "__main__":
    main()
