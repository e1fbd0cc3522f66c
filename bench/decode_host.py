"""Host time of one whole-model decode step, on the CPU: what a GPU decode step waits for.

The decode steps measured on the H200 (BENCHMARKS.md, "Whole-model decode") were host-bound:
130–190 ms per token for the GDN+DSA hybrid against ~4 ms of memory traffic. This script measures
the host side alone, without a GPU: the model runs its Triton path under the CPU interpreter with
every kernel launch and every projection GEMM replaced by a no-op (outputs allocated, never
computed), so what is timed is Python, op dispatch, argument checks and allocation. The numbers
are this CPU's; the GPU machine's host is faster, and its real Triton launcher (stubbed here) adds
its own cost per launch.

Usage:
    PYTHONPATH=. python bench/decode_host.py
Environment: MODEL (example stem, default `lt2_hybrid_gdn_dsa`), STEPS (per repeat, 5), REPEATS
(7), CONTEXT (prefill length, 8). Toy sizes (dim 64, 2 heads of 32, vocab 256; the rest of the
example as written). Prints min and median ms per step, and the step's kernel-launching aten ops
(top-level aten ops that launch at least one kernel on a GPU: views, allocations and no-op casts
aside; the stubbed GEMMs and Triton kernels not included), and writes $OUT/decode_host.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the CPU launch path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stub_kernels_and_gemms() -> None:
    """Kernel launches and projection GEMMs become no-ops (call after the model is traced)."""
    import triton.runtime.interpreter as interp

    interp.InterpretedFunction.run = lambda self, *args, **kwargs: None
    F.linear = lambda x, w, b=None: x.new_empty(*x.shape[:-1], w.shape[0])


# aten ops that launch no kernel: views and allocations
_NO_KERNEL = {
    "aten::view", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::expand",
    "aten::as_strided", "aten::unflatten", "aten::transpose", "aten::t", "aten::permute", "aten::split",
    "aten::split_with_sizes", "aten::narrow", "aten::chunk", "aten::unbind", "aten::movedim", "aten::alias",
    "aten::_unsafe_view", "aten::detach", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided", "aten::resize_",
    "aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense",
}  # fmt: skip
# ops that launch a kernel only when they copy (a child op shows the copy)
_COPY_CHILD = {
    "aten::to": {"aten::_to_copy"},
    "aten::contiguous": {"aten::clone"},
    "aten::reshape": {"aten::clone", "aten::_reshape_copy"},
    "aten::flatten": {"aten::clone", "aten::_reshape_copy"},
}


def launching_ops(step) -> int:
    """Top-level aten ops of one call of `step` that launch at least one kernel on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()

    def launches(e) -> bool:
        if e.name in _COPY_CHILD:
            return any(ch.name in _COPY_CHILD[e.name] for ch in e.cpu_children)
        return e.name not in _NO_KERNEL

    top = [e for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    return sum(1 for e in top if launches(e))


def main() -> None:
    import lt2dsl

    stem = os.environ.get("MODEL", "lt2_hybrid_gdn_dsa")
    steps, repeats = int(os.environ.get("STEPS", 5)), int(os.environ.get("REPEATS", 7))
    context = int(os.environ.get("CONTEXT", 8))
    torch.set_num_threads(1)
    model = lt2dsl.compile(
        os.path.join(ROOT, "examples", f"{stem}.lt2"),
        backend="triton",
        dtype=torch.bfloat16,
        device="cpu",
        dim=64,
        heads=2,
        head_dim=32,
        vocab=256,
    ).eval()
    _ = model.graph_module  # trace with the real ops, then stub them
    stub_kernels_and_gemms()
    cache = model.new_cache(1, max_len=context + (repeats + 1) * steps + 8)
    per_step = []
    with torch.no_grad():
        model(torch.randint(0, 256, (1, context)), cache)
        tok = torch.randint(0, 256, (1, 1))
        for _ in range(steps):  # warm
            model(tok, cache)
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(steps):
                model(tok, cache)
            per_step.append(1000 * (time.perf_counter() - t0) / steps)
        ops = launching_ops(lambda: model(tok, cache))
    row = {
        "model": stem,
        "launching_aten_ops": ops,
        "min_ms": min(per_step),
        "median_ms": statistics.median(per_step),
        "repeats_ms": per_step,
        "torch": torch.__version__,
    }
    print(
        f"{stem}: host per decode step {row['min_ms']:.1f} ms min, {row['median_ms']:.1f} ms median; "
        f"{ops} kernel-launching aten ops per step"
    )
    out = os.environ.get("OUT", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "decode_host.json"), "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
