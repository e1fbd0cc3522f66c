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

`--trace` lists the engine step's launches by graph node instead (each node of the lowered graph
runs under a `record_function` of its name), one line per node of the first application of each
block kind that launches anything: where the fusable chains are.

Usage:
    PYTHONPATH=. python bench/decode_launches.py [MODEL ...] [--out DIR] [--trace] [--opt-in RULE]
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
_NODE = "node:"  # prefix of the record_function ranges `--trace` opens around graph nodes


@contextmanager
def stubbed_kernels() -> Iterator[collections.Counter]:
    """Triton launches and `F.linear` become no-ops counted in the yielded Counter (restored on exit)."""
    import triton.runtime.interpreter as interp

    counts: collections.Counter = collections.Counter()
    run, linear = interp.InterpretedFunction.run, F.linear

    def fake_run(self, *args, **kwargs):
        counts[f"triton:{self.fn.__name__}"] += 1
        _mark(f"triton:{self.fn.__name__}")

    def fake_linear(x, w, b=None):
        counts["gemm"] += 1
        _mark("gemm")
        return x.new_empty(*x.shape[:-1], w.shape[0])

    interp.InterpretedFunction.run, F.linear = fake_run, fake_linear
    try:
        yield counts
    finally:
        interp.InterpretedFunction.run, F.linear = run, linear


def _mark(kind: str) -> None:
    """A stubbed launch as a profiler range `mark:<kind>` (the trace finds its node above it)."""
    from torch.profiler import record_function

    with record_function(f"mark:{kind}"):
        pass


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


def _node_of(e) -> str | None:
    """The graph node (`--trace`'s range) an event ran under, or None."""
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith(_NODE):
            return p.name[len(_NODE) :]
        p = p.cpu_parent
    return None


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


def trace_step(step: Callable[[], object], gm) -> dict[str, collections.Counter]:
    """Launches of one call of `step` by graph node of `gm` (in graph order), under
    `stubbed_kernels()`: `gm` runs through an `fx.Interpreter` that opens a profiler range per node."""
    from torch.profiler import ProfilerActivity, profile, record_function

    class Ranged(torch.fx.Interpreter):
        def run_node(self, n):
            with record_function(_NODE + n.name):
                return super().run_node(n)

    gm.forward = lambda *a, **k: Ranged(gm).run(*a, **k)  # an instance attribute: nn.Module calls it
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
    finally:
        del gm.forward
    out: dict[str, collections.Counter] = {n.name: collections.Counter() for n in gm.graph.nodes}
    for e in prof.events():
        node = _node_of(e)
        if node is None:
            continue
        if e.name.startswith("mark:"):
            out[node][e.name[len("mark:") :]] += 1
        elif e.name.startswith("aten::") and _outermost_aten(e) and _launches(e):
            out[node]["gemm" if e.name in _GEMMS else e.name] += 1
    return {k: c for k, c in out.items() if c}


def block_of(node: str, gm) -> str:
    """The module path `blocks.<i>` a node's call reads (its first `get_attr`/module argument), or
    "model" for the nodes outside any block (embedding, final norm, head, cache bookkeeping)."""
    n = next(x for x in gm.graph.nodes if x.name == node)
    near = [n, *n.all_input_nodes]
    near += [y for x in near[1:] if x.op == "call_function" for y in x.all_input_nodes]  # concatenations
    for x in near:
        if x.op in ("call_module", "get_attr") and str(x.target).startswith("blocks."):
            return ".".join(str(x.target).split(".")[:2])
    return "model"


def segments(by_node: dict[str, collections.Counter], gm) -> list[tuple[str, list]]:
    """(block, [(node, launches)]) runs of consecutive launching nodes of one block application, in
    graph order; a node that reads no block's parameter belongs to the block of the launch before it
    (the model's own nodes, embedding and head, read the model's parameters)."""
    out: list[tuple[str, list]] = []
    for node, c in by_node.items():
        b = block_of(node, gm)
        if b == "model" and out and not node_reads_model(node, gm):
            b = out[-1][0]
        if not out or out[-1][0] != b:
            out.append((b, []))
        out[-1][1].append((node, c))
    return out


def node_reads_model(node: str, gm) -> bool:
    """Whether a node calls or reads a module of the model outside the blocks, or ends the step."""
    n = next(x for x in gm.graph.nodes if x.name == node)
    if n.op == "call_function" and getattr(n.target, "__name__", "") == "cache_advance":
        return True
    return any(x.op in ("call_module", "get_attr") for x in [n, *n.all_input_nodes])


def print_trace(name: str, model, console) -> dict:
    """The engine step's launches by node, the first application of each block kind (`--trace`)."""
    from rich.table import Table

    gm = model.graph_module
    with torch.no_grad(), stubbed_kernels():
        by_node = trace_step(engine_step(model), gm)
    kinds, report = {}, {}
    for block, nodes in segments(by_node, gm):
        kind = "model" if block == "model" else type(model.get_submodule(f"{block}.mixers.0")).__name__
        kinds[kind] = kinds.get(kind, 0) + 1
        if kinds[kind] > 1 and kind != "model":
            continue
        t = Table(title=f"{name}: one {kind} application ({block}) of the engine step")
        t.add_column("node")
        t.add_column("launches")
        for node, c in nodes:
            t.add_row(node, ", ".join(f"{k} ×{v}" if v > 1 else k for k, v in c.items()))
        t.add_row("[bold]total[/]", str(sum(sum(c.values()) for _, c in nodes)))
        console.print(t)
        report.setdefault(kind, [{node: dict(c) for node, c in nodes}])
    console.print(f"applications per kind: {kinds}")
    return report


def totals(c: collections.Counter) -> dict[str, int]:
    """{gemm, triton, aten, total} of a step's Counter."""
    tri = sum(v for k, v in c.items() if k.startswith("triton:"))
    aten = sum(v for k, v in c.items() if k.startswith("aten::"))
    return {"gemm": c["gemm"], "triton": tri, "aten": aten, "total": c["gemm"] + tri + aten}


def toy_model(name: str, opt_in: tuple[str, ...] = ()):
    """The example `name` (or the 12-layer GDN model, `gdn12`) at toy sizes, bf16, Triton path, with
    the opt-in fusion rules `opt_in` (`lowering.fx_passes.OPT_IN`)."""
    import lt2dsl
    from bench.gdn12 import GDN12

    src = GDN12 if name == "gdn12" else str(ROOT / "examples" / f"{name}.lt2")
    kw = {"backend": "triton", "dtype": torch.bfloat16, "device": "cpu", "opt_in": opt_in}
    model = lt2dsl.compile(src, **kw, **TOY).eval()
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


def count_model(name: str, opt_in: tuple[str, ...] = ()) -> dict[str, collections.Counter]:
    """{"engine", "dynamic"} → launches of one decode step of the toy model `name` (with the opt-in
    fusion rules `opt_in`)."""
    model = toy_model(name, opt_in)
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
    p.add_argument("--trace", action="store_true", help="the engine step's launches by graph node")
    p.add_argument("--opt-in", action="append", default=[], metavar="RULE",
                   help="an opt-in fusion rule to run too (e.g. decode_gemv); repeatable")  # fmt: skip
    args = p.parse_args()
    names = args.models or list(MODELS)
    console, report = Console(), {}
    if args.trace:
        for name in names:
            print_trace(name, toy_model(name, tuple(args.opt_in)), console)
        return
    for name in names:
        counts = count_model(name, tuple(args.opt_in))
        report[name] = {p: {"totals": totals(c), "by_kind": dict(c.most_common())} for p, c in counts.items()}
        rules = "".join(f" +{r}" for r in args.opt_in)
        t = Table(title=f"{name}{rules}: launches of one decode step (toy size, B=1)")
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
    meta = {"torch": torch.__version__, "opt_in": args.opt_in}
    tmp.write_text(json.dumps({**meta, "models": report}, indent=1))
    os.replace(tmp, out / "decode_launches.json")


if __name__ == "__main__":
    main()
