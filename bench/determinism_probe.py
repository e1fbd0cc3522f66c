"""Run-to-run repeatability of every Triton op's forward and backward on the GPU, per forced config.

A pipelining race or miscompile can give wrong outputs in some runs and not others (the mLSTM
output kernel at 4 warps, 2 stages did), which one passing test run does not rule out. Kernels
without atomics must give bit-identical results when run again on the same inputs, so this runs each op's
fwd+bwd (the benchmark cases at B=4, T=8192, H=16, D=128, bf16) `REPS` times with every autotuned
kernel forced to config i, for each i its family has (and once autotuned), and reports the largest
difference from the first run, relative to the tensor's largest magnitude, over the output and
every input gradient. Rounding-order noise from atomics is ~1e-3 of bf16 at most; a race or
miscompile shows as O(1).

    PYTHONPATH=. OUT=$OUT python3 bench/determinism_probe.py    # writes $OUT/determinism_probe.json
    ONLY=gdn,mlstm REPS=4 ...                                     # a subset, more runs
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("T", "8192")

from bench import kernels_attn, kernels_decay, kernels_delta
from bench.harness import _first


def _families():
    """(benchmark module, groups, impls, forced-config context factory, number of configs)."""
    from lt2dsl.kernels.attention.triton_bwd import N_BWD_CONFIGS, forced_bwd_config
    from lt2dsl.kernels.common import tiles
    from lt2dsl.kernels.delta.configs import N_CONFIGS, forced_config

    @contextlib.contextmanager
    def decay_forced(i):
        tiles.force_config(i)
        try:
            yield
        finally:
            tiles.force_config(None)

    return [
        (kernels_delta, ("gdn B=4", "deltanet B=4", "kda B=4"), ("lt2dsl",), forced_config, N_CONFIGS),
        (
            kernels_decay,
            ("simple_gla B=4", "gla B=4", "mlstm B=4", "retnet B=4", "linear B=4"),
            ("lt2dsl",),
            decay_forced,
            None,  # known after the first case has imported every decay kernel
        ),
        (
            kernels_attn,
            ("attn full T=8192", "swa w=512 T=8192"),
            ("lt2dsl+gate", "lt2dsl"),
            forced_bwd_config,
            N_BWD_CONFIGS,
        ),
    ]


def _run(fn, leaves):
    for t in leaves:
        t.grad = None
    out = _first(fn())
    gen = torch.Generator(device=out.device).manual_seed(0)
    do = torch.randn(out.shape, generator=gen, device=out.device, dtype=out.dtype)
    out.backward(do)
    return [out.detach().clone()] + [t.grad.detach().clone() for t in leaves]


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def main() -> None:
    reps = int(os.environ.get("REPS", "3"))
    only = [s for s in os.environ.get("ONLY", "").split(",") if s]
    rows = []
    out_path = os.path.join(os.environ.get("OUT", "."), "determinism_probe.json")
    print(
        f"{'case':42s} {'config':>6s} {'worst rel diff':>15s}  per tensor (output, then gradients)",
        flush=True,
    )
    for module, groups, impls, forced, n_cfg in _families():
        cases = [
            c
            for c in module.cases()
            if c.backward
            and c.impl in impls
            and any(c.group.startswith(g) for g in groups)
            and (not only or any(s in c.group for s in only))
        ]
        for c in cases:
            fn, leaves = c.make()
            if n_cfg is None:
                from lt2dsl.kernels.common import tiles

                _run(fn, leaves)  # imports and registers the op's kernels
                n_cfg = tiles.max_configs()
            for cfg in [None, *range(n_cfg)]:
                ctx = contextlib.nullcontext() if cfg is None else forced(cfg)
                t0 = time.time()
                label = "auto" if cfg is None else str(cfg)
                name = f"{c.group} {c.impl}"
                try:
                    with ctx:
                        first = _run(fn, leaves)
                        diffs = [0.0] * len(first)
                        for _ in range(reps - 1):
                            again = _run(fn, leaves)
                            diffs = [max(d, _rel_diff(a, b)) for d, a, b in zip(diffs, again, first)]
                except Exception as e:  # a config that does not fit this GPU, say: record, go on
                    print(f"{name:42s} {label:>6s} error {e!r:.200}", flush=True)
                    rows.append({"case": name, "config": label, "error": repr(e)[:300]})
                    continue
                print(
                    f"{name:42s} {label:>6s} {max(diffs):15.3e}  "
                    + " ".join(f"{d:.1e}" for d in diffs)
                    + f"  ({time.time() - t0:.0f} s)",
                    flush=True,
                )
                rows.append({"case": name, "config": label, "reps": reps, "rel_diffs": diffs})
                with open(out_path, "w") as fh:
                    json.dump(rows, fh, indent=1)
            del fn, leaves
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
