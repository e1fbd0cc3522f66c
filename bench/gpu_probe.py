"""Localise a failing Triton kernel on the GPU: each case in its own process, launches blocking.

    PYTHONPATH=. python bench/gpu_probe.py            # every case, one subprocess each
    PYTHONPATH=. python bench/gpu_probe.py CASE       # one case in this process

A case is `op:T:D:dtype:mode` (mode fwd | bwd | decode). The child compares against the float64
reference and prints OK with the errors, WRONG, or the launch that crashed (CUDA_LAUNCH_BLOCKING=1
makes the failing launch raise, so the traceback names the kernel).
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor

OPS = ("delta_rule", "gated_delta_rule", "kda")
CASES = [
    f"{op}:{T}:{D}:{dt}:{mode}"
    for op in OPS
    for (T, D, dt, mode) in [
        (64, 64, "bf16", "fwd"),
        (100, 64, "fp32", "fwd"),
        (100, 64, "bf16", "bwd"),
        (1, 64, "bf16", "decode"),
        (1000, 128, "bf16", "fwd"),
    ]
]


def inputs(op, T, D, dtype, B=1, H=2):
    import torch
    import torch.nn.functional as F

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: under TRITON_INTERPRET=1
    g = torch.Generator(device=device).manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device=device, dtype=torch.float32)  # noqa: E731
    q, k = F.normalize(r(B, T, H, D), dim=-1), F.normalize(r(B, T, H, D), dim=-1)
    v = r(B, T, H, D)
    beta = torch.rand(B, T, H, generator=g, device=device)
    x = dict(q=q, k=k, v=v, beta=beta)
    if op == "gated_delta_rule":
        x["g"] = F.logsigmoid(r(B, T, H))
    if op == "kda":
        x["g"] = F.logsigmoid(r(B, T, H, D)) / 4
    x = {n: t.to(dtype) if n in ("q", "k", "v", "beta") else t for n, t in x.items()}
    x["initial_state"] = r(B, H, D, D) * 0.1
    return x


def run_one(case: str) -> None:
    import torch

    import lt2dsl.kernels as K

    op, T, D, dt, mode = case.split(":")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
    x = inputs(op, int(T), int(D), dtype)
    fn = getattr(K, op)
    if mode == "bwd":
        for n in ("q", "k", "v"):
            x[n].requires_grad_()
    o, S = fn(**x, output_final_state=True, backend="triton")
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    ref_in = {n: t.detach().double() for n, t in x.items()}
    o_ref, S_ref = fn(**ref_in, output_final_state=True, backend="reference")
    err = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    msg = f"o {err(o, o_ref):.2e} S {err(S, S_ref):.2e}"
    if mode == "bwd":
        do = torch.randn_like(o)
        gq = torch.autograd.grad(o, [x["q"], x["k"], x["v"]], do)
        sync()
        for n in ("q", "k", "v"):
            ref_in[n].requires_grad_()
        o_ref2, _ = fn(**ref_in, output_final_state=True, backend="reference")
        gr = torch.autograd.grad(o_ref2, [ref_in["q"], ref_in["k"], ref_in["v"]], do.double())
        msg += " " + " ".join(f"d{n} {err(a, b):.2e}" for n, a, b in zip("qkv", gq, gr))
    worst = max(float(w) for w in msg.split()[1::2])
    print(("OK   " if worst < (2e-2 if dt == "bf16" else 1e-3) else "WRONG") + f" {case}: {msg}", flush=True)


def main() -> None:
    if len(sys.argv) > 1:
        try:
            run_one(sys.argv[1])
        except Exception as e:  # report where the blocking launch failed
            tb = [ln for ln in traceback.format_exc().splitlines() if "lt2dsl/" in ln or "Error" in ln]
            print(f"CRASH {sys.argv[1]}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            print("      " + "\n      ".join(tb[-6:]))
        return
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")

    def child(case: str) -> str:
        try:
            p = subprocess.run(
                [sys.executable, __file__, case], env=env, capture_output=True, text=True, timeout=240
            )
        except subprocess.TimeoutExpired:
            return f"TIMEOUT {case}"
        return p.stdout.strip() or f"DIED {case}: " + " | ".join(p.stderr.strip().splitlines()[-3:])

    cases = os.environ["PROBE_CASES"].split() if os.environ.get("PROBE_CASES") else CASES
    # Cases compile independently, so run several at once (compilation is CPU-bound).
    with ThreadPoolExecutor(int(os.environ.get("NPROC", "8"))) as pool:
        for out in pool.map(child, cases):
            print(out, flush=True)


if __name__ == "__main__":
    main()
