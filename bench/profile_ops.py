"""Where the time of one op goes on the GPU: a per-kernel breakdown from the torch profiler.

Takes the cases of the kernel benchmarks (`bench/kernels_{delta,decay,attn}.py`) whose
`group impl mode` line contains one of the comma-separated substrings in `PROFILE` (e.g.
`PROFILE="gdn B=4 T=8192 lt2dsl fwd+bwd,kda B=4 T=8192 lt2dsl fwd"`), runs each a few times
(compile, autotune), profiles `REPS` more calls and prints, per case, the kernels by device time
per call with their launch counts. Writes `$OUT/profile_ops.json`. Timing figures for the record
come from the benchmarks themselves; this says what to fix.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import kernels_attn, kernels_decay, kernels_delta
from bench.harness import Case, kernel_times


def _label(c: Case) -> str:
    return f"{c.group} {c.impl} {'fwd+bwd' if c.backward else 'fwd'}"


def profile_case(c: Case, reps: int) -> list[dict]:
    fn, leaves = c.make()
    do = None

    def once():
        nonlocal do
        out = fn()
        out = out[0] if isinstance(out, tuple | list) else out
        if c.backward:
            do = torch.randn_like(out) if do is None else do
            out.backward(do)
            for t in leaves:
                t.grad = None

    return kernel_times(once, reps)


def main() -> None:
    want = [s for s in os.environ.get("PROFILE", "").split(",") if s]
    reps = int(os.environ.get("REPS", "5"))
    cases = kernels_delta.cases() + kernels_decay.cases() + kernels_attn.cases()
    chosen = [c for c in cases if any(w in _label(c) for w in want)]
    report = {}
    for c in chosen:
        label = _label(c)
        try:
            rows = profile_case(c, reps)
        except Exception as e:  # one failing op must not hide the others
            print(f"== {label}: ERROR {e!r:.200}", flush=True)
            continue
        report[label] = rows
        total = sum(r["us_per_call"] for r in rows)
        print(f"== {label}: {total / 1e3:.3f} ms of kernels per call", flush=True)
        for r in rows[:10]:
            us, n = r["us_per_call"], r["launches_per_call"]
            print(f"   {us:9.1f} us  x{n:<5.0f} {r['kernel'][:90]}", flush=True)
        torch.cuda.empty_cache()
    tag = os.environ.get("TAG")
    name = "profile_ops" + (f"_{tag}" if tag else "") + ".json"
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
