"""Kernel launches of one whole-model decode step, counted on the CPU, by kind.

A decode step on the GPU is a chain of small kernels (BENCHMARKS.md, "Whole-model decode": the
looped GDN+DSA hybrid at B=1 spent 13.4 ms on ~2,900 launches); fewer launches is the lever. This
counts them without a GPU: the model runs its Triton path under the CPU interpreter with every
Triton launch and every projection GEMM replaced by a no-op that only counts (outputs allocated,
never computed), and the torch profiler records the aten ops of one step. A step's launches are

* `gemm`: `F.linear` calls and the aten matrix products (`mm`, `bmm`, `addmm`, `linear`, `einsum`);
* `triton:<kernel>`: one per Triton kernel launch;
* `aten::<op>`: every aten op the step calls outside another aten op (inside a custom op too)
  that launches a kernel on a GPU: views, allocations and casts that copy nothing aside.

Two steps per model: `engine` (the static-cache step `generate` replays as a CUDA graph, sampling
included; what the GPU runs) and `dynamic` (`model(tok, cache)` with a dynamic cache).

Usage:
    PYTHONPATH=. python bench/decode_launches.py [MODEL ...] [--out DIR]
MODEL: an example stem or `gdn12` (default: lt2_hybrid_gdn_dsa ouro_looped_transformer gdn12). Toy
sizes (dim 64, 2 heads of 32, vocab 256; the rest of each model as written). Prints a table per
model and writes DIR/decode_launches.json (default: the current folder).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the CPU launch path

import argparse
import collections
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("lt2_hybrid_gdn_dsa", "ouro_looped_transformer", "gdn12")
TOY = {"dim": 64, "heads": 2, "head_dim": 32, "vocab": 256}
PROMPT = 8

# aten ops that launch no kernel: views and allocations
_NO_KERNEL = {
    "aten::view", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::expand",
    "aten::expand_as", "aten::view_as", "aten::as_strided", "aten::unflatten", "aten::transpose",
    "aten::t", "aten::permute", "aten::split", "aten::split_with_sizes", "aten::narrow", "aten::chunk",
    "aten::unbind", "aten::movedim", "aten::alias", "aten::_unsafe_view", "aten::detach",
    "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg", "aten::empty", "aten::empty_like",
    "aten::new_empty", "aten::empty_strided", "aten::resize_", "aten::result_type", "aten::is_nonzero",
    "aten::item", "aten::_local_scalar_dense",
}  # fmt: skip
# ops that launch a kernel only when they copy (a child op shows the copy)
_COPY_CHILD = {
    "aten::to": {"aten::_to_copy"},
    "aten::contiguous": {"aten::clone"},
    "aten::reshape": {"aten::clone", "aten::_reshape_copy"},
    "aten::flatten": {"aten::clone", "aten::_reshape_copy"},
}
_GEMMS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::matmul", "aten::linear", "aten::einsum"}


@contextmanager
def stubbed_kernels() -> Iterator[collections.Counter]:
    """Triton launches and `F.linear` become no-ops counted in the yielded Counter (restored on exit)."""
    import triton.runtime.interpreter as interp

    counts: collections.Counter = collections.Counter()
    run, linear = interp.InterpretedFunction.run, F.linear

    def fake_run(self, *args, **kwargs):
        counts[f"triton:{self.fn.__name__}"] += 1

    def fake_linear(x, w, b=None):
        counts["gemm"] += 1
        return x.new_empty(*x.shape[:-1], w.shape[0])

    interp.InterpretedFunction.run, F.linear = fake_run, fake_linear
    try:
        yield counts
    finally:
        interp.InterpretedFunction.run, F.linear = run, linear


def _launches(e) -> bool:
    if e.name in _COPY_CHILD:
        return any(ch.name in _COPY_CHILD[e.name] for ch in e.cpu_children)
    return e.name not in _NO_KERNEL


def _outermost_aten(e) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return False
        p = p.cpu_parent
    return True


def count_step(step: Callable[[], object], stubs: collections.Counter) -> collections.Counter:
    """Launches of one call of `step` by kind (module docstring), under `stubbed_kernels()`."""
    from torch.profiler import ProfilerActivity, profile

    before = collections.Counter(stubs)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    out = collections.Counter(stubs)
    out.subtract(before)
    for e in prof.events():
        if e.name.startswith("aten::") and _outermost_aten(e) and _launches(e):
            out["gemm" if e.name in _GEMMS else e.name] += 1
    return +out


def totals(c: collections.Counter) -> dict[str, int]:
    """{gemm, triton, aten, total} of a step's Counter."""
    tri = sum(v for k, v in c.items() if k.startswith("triton:"))
    aten = sum(v for k, v in c.items() if k.startswith("aten::"))
    return {"gemm": c["gemm"], "triton": tri, "aten": aten, "total": c["gemm"] + tri + aten}


def toy_model(name: str):
    """The example `name` (or the 12-layer GDN model, `gdn12`) at toy sizes, bf16, Triton path."""
    import lt2dsl
    from bench.gdn12 import GDN12

    src = GDN12 if name == "gdn12" else str(ROOT / "examples" / f"{name}.lt2")
    model = lt2dsl.compile(src, backend="triton", dtype=torch.bfloat16, device="cpu", **TOY).eval()
    _ = model.graph_module  # traced and fused before the kernels are stubbed
    return model


def engine_step(model) -> Callable[[], object]:
    """The engine's decode step after a prompt (the prefill runs here): one `next` of `stream`."""
    from lt2dsl.engine import stream

    it = stream(model, torch.zeros(1, PROMPT, dtype=torch.long), 64)
    next(it)  # prefill and the first token
    next(it)  # one step, so the step's own first-use work is done
    return lambda: next(it)


def dynamic_step(model) -> Callable[[], object]:
    """`model(tok, cache)` with a dynamic cache after a prompt."""
    cache = model.new_cache(1, max_len=PROMPT + 64)
    tok = torch.zeros(1, 1, dtype=torch.long)
    model(torch.zeros(1, PROMPT, dtype=torch.long), cache)
    model(tok, cache)
    return lambda: model(tok, cache)


def count_model(name: str) -> dict[str, collections.Counter]:
    """{"engine", "dynamic"} → launches of one decode step of the toy model `name`."""
    model = toy_model(name)
    out = {}
    with torch.no_grad(), stubbed_kernels() as stubs:
        for path, make in (("engine", engine_step), ("dynamic", dynamic_step)):
            out[path] = count_step(make(model), stubs)
    return out


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    torch.set_num_threads(1)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="*", help="example stems or gdn12 [all three]")
    p.add_argument("--out", type=Path, default=Path("."), help="folder of decode_launches.json [.]")
    args = p.parse_args()
    names = args.models or list(MODELS)
    console, report = Console(), {}
    for name in names:
        counts = count_model(name)
        report[name] = {p: {"totals": totals(c), "by_kind": dict(c.most_common())} for p, c in counts.items()}
        t = Table(title=f"{name}: launches of one decode step (toy size, B=1)")
        t.add_column("kind")
        for p in counts:
            t.add_column(p, justify="right")
        kinds = sorted(set().union(*counts.values()), key=lambda k: -max(c[k] for c in counts.values()))
        for k in ("gemm", "triton", "aten", "total"):
            t.add_row(f"[bold]{k}[/]", *(str(totals(c)[k]) for c in counts.values()))
        for k in kinds:
            if k != "gemm":
                t.add_row(k, *(str(c[k]) for c in counts.values()))
        console.print(t)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "decode_launches.json.tmp"
    tmp.write_text(json.dumps({"torch": torch.__version__, "models": report}, indent=1))
    os.replace(tmp, out / "decode_launches.json")


if __name__ == "__main__":
    main()
