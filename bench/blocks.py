"""GPU benchmark of the FX fusion pass: one block of each kind and a whole model, fused vs unfused.

Three implementations of the same lowered graph (bf16, backend="auto": the mixers' Triton kernels):
* `unfused`: the lowered `torch.fx` graph as traced;
* `fused`: the same graph after `lt2dsl.lowering.fx_passes.fuse` (all rules);
* `compile`: `torch.compile` (Inductor, default mode) of the unfused graph.
Each is timed forward (under `torch.no_grad`, as a prefill) and forward+backward (parameters and
input get gradients) with `triton.testing.do_bench` (median), and its CUDA kernel launches are
counted from one `torch.profiler` trace of a warm call, which also gives the call's kernel time
(all device time; the wall time above it is the GPU waiting on the host) and the time per kernel
name (`kernels` in the JSON). Blocks: B=4, T=2048, dim 2048, 16 heads of 128, SwiGLU 5632, each
kind with its defaults (DSA as in the hybrid example); the model:
`examples/lt2_hybrid_gdn_dsa.lt2` (GDN+DSA, dim 2048, loop T=4) at B=1, T=4096, launches also per
block application. Before timing, fused outputs are checked against the unfused ones (relative
RMS error, bf16).

Usage:
    PYTHONPATH=. python bench/blocks.py
Environment: ONLY=gdn,dsa,model (kinds to run; `model` is the hybrid; default every kind and the
model), B, T (blocks), MODEL_B, MODEL_T, COMPILE=0 (skip torch.compile), MODEL_COMPILE=1 (also
compile the whole model; slow to compile: 96 unrolled block applications). Writes $OUT/blocks.json
(updated after every kind, so a cut-off run keeps what it measured) and $OUT/blocks.md (the tables
for BENCHMARKS.md); the tables are printed last.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import harness

# SMOKE=1: a CPU dry run of the whole script at toy sizes (no timing or launch counts), for CI
SMOKE = os.environ.get("SMOKE", "0") == "1"
DEV, DT = ("cpu", torch.float32) if SMOKE else ("cuda", torch.bfloat16)
DIM = 64 if SMOKE else 2048
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FILE = os.path.join(ROOT, "examples", "lt2_hybrid_gdn_dsa.lt2")
IMPLS = ("unfused", "fused", "compile")

SETTINGS = f"""  dim = {DIM}
  vocab = {256 if SMOKE else 32000}
  heads = {2 if SMOKE else 16}
  head_dim = {32 if SMOKE else 128}
  mlp = swiglu(hidden={128 if SMOKE else 5632})
  norm = rmsnorm(eps=1e-6)
  max_len = 32k
"""
SMOKE_MODEL = {"dim": 64, "vocab": 256, "heads": 2, "head_dim": 32, "mlp": "swiglu(hidden=128)"}
# one block per kind at its defaults; DSA as in the hybrid example
KINDS = {
    "gdn": "gdn",
    "kda": "kda",
    "deltanet": "deltanet",
    "gla": "gla",
    "retnet": "retnet",
    "mamba2": "mamba2",
    "mlstm": "mlstm",
    "linear": "linear",
    "full": "full",
    "swa": "swa",
    "dsa": "dsa(topk=2048, index_heads=4, index_dim=64)",
    "nsa": "nsa",
    "tmm": "tmm",
}


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def selected() -> list[str]:
    # ONLY's order is the run order, so a time-limited run measures what matters first
    only = [s for s in os.environ.get("ONLY", "").split(",") if s]
    names = [*KINDS, "model"]
    return [k for k in only if k in names] if only else names


# ---- graphs -------------------------------------------------------------------------------------


def fused_copy(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, dict]:
    from lt2dsl.lowering.fx_passes import COUNTERS, fuse

    out = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name="LT2Fused")
    fuse(out)
    return out, {k: v for k, v in COUNTERS.items() if v}


class Subject:
    """One benchmarked graph: its three implementations, its input and its parameters."""

    def __init__(
        self,
        name: str,
        gm: torch.fx.GraphModule,
        make_input: Callable[[], torch.Tensor],
        params: list[torch.nn.Parameter],
        blocks: int,
        compile_it: bool,
    ):
        self.name, self.make_input, self.params, self.blocks = name, make_input, params, blocks
        fused, self.fired = fused_copy(gm)
        self.fns: dict[str, Callable] = {"unfused": gm, "fused": fused}
        if compile_it:
            self.fns["compile"] = torch.compile(gm)

    def case_fn(self, impl: str, backward: bool) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
        fn, x = self.fns[impl], self.make_input()
        leaves = [t for t in [x, *self.params] if t.is_floating_point()]
        if backward:
            return (lambda: fn(x)), leaves

        def forward():
            with torch.no_grad():
                return fn(x)

        return forward, []


def block_subject(kind: str, compile_it: bool) -> Subject:
    import lt2dsl
    from lt2dsl.lowering.to_fx import LoweringTracer

    B, T = env_int("B", 1 if SMOKE else 4), env_int("T", 16 if SMOKE else 2048)
    text = f"model b {{\n{SETTINGS}\n  {KINDS[kind]}\n}}\n"
    model = lt2dsl.compile(text, backend="auto", dtype=DT, device=DEV)
    block = model.blocks[0]
    gm = torch.fx.GraphModule(block, LoweringTracer().trace(block), class_name="LT2Block")

    def make_input():
        return (torch.randn(B, T, DIM, device=DEV, dtype=torch.float32)).to(DT).requires_grad_()

    return Subject(f"{kind} block B={B} T={T}", gm, make_input, list(block.parameters()), 1, compile_it)


def model_subject(compile_it: bool) -> Subject:
    import lt2dsl

    B, T = env_int("MODEL_B", 1), env_int("MODEL_T", 16 if SMOKE else 4096)
    # fuse=False: the subject is the unfused graph, `fused_copy` applies the rules (the default
    # fuse=True made both sides the fused graph: every rule had fired already)
    model = lt2dsl.compile(
        MODEL_FILE, backend="auto", dtype=DT, device=DEV, fuse=False, **(SMOKE_MODEL if SMOKE else {})
    )
    vocab = model.config.vocab

    def make_input():
        return torch.randint(0, vocab, (B, T), device=DEV)

    return Subject(
        f"gdn+dsa model B={B} T={T}",
        model.graph_module,
        make_input,
        list(model.parameters()),
        model.applications,
        compile_it,
    )


# ---- measuring ----------------------------------------------------------------------------------


def _run(fn: Callable[[], torch.Tensor], backward: bool, do: torch.Tensor | None) -> torch.Tensor:
    out = fn()
    if backward:
        out.backward(do if do is not None else torch.randn_like(out))
    return out


def count_launches(fn: Callable[[], torch.Tensor], backward: bool) -> dict:
    """CUDA kernels (and memcpy/memset) of one warm call, from a torch.profiler trace."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    out = _run(fn, backward, None)  # warm: autotuning, compilation
    do = torch.randn_like(out) if backward else None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _run(fn, backward, do)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    names = [e.name for e in events]
    copies = sum(n.startswith(("Memcpy", "Memset")) for n in names)
    # device time per kernel name, largest first: where a fused graph loses to the unfused one
    per: dict[str, list[float]] = {}
    for e in events:
        c = per.setdefault(e.name[:80], [0, 0.0])
        c[0] += 1
        c[1] += e.device_time_total
    top = sorted(per.items(), key=lambda kv: -kv[1][1])
    kernels = [{"name": n, "calls": c, "us": round(us, 1)} for n, (c, us) in top]
    # all device time of the call: the wall time minus this is the GPU waiting on the host
    kernel_ms = sum(us for _, (_, us) in top) / 1000
    return {"launches": len(names) - copies, "copies": copies, "kernel_ms": kernel_ms, "kernels": kernels}


def check_fused(subject: Subject) -> float:
    """Relative RMS error of the fused forward against the unfused one (bf16, same input)."""
    from lt2dsl.kernels.fused.testing import rel_rms

    x = subject.make_input()
    with torch.no_grad():
        return rel_rms(subject.fns["fused"](x).float(), subject.fns["unfused"](x).float())


def measure(subject: Subject, impl: str, backward: bool) -> dict:
    row = {"group": subject.name, "impl": impl, "backward": backward, "blocks": subject.blocks}
    if impl not in subject.fns:
        return {**row, "error": "skipped"}
    try:
        case = harness.Case(
            group=subject.name, impl=impl, make=lambda: subject.case_fn(impl, backward), backward=backward
        )
        fn, _ = case.make()
        if SMOKE:
            t0 = time.perf_counter()
            _run(fn, backward, None)
            row.update(ms=1000 * (time.perf_counter() - t0), launches=0, launches_per_block=0.0)
            return row
        row.update(count_launches(fn, backward))
        row["launches_per_block"] = row["launches"] / subject.blocks
        row["ms"] = harness.time_case(case)
    except Exception as e:  # one failing implementation must not hide the others
        traceback.print_exc()
        row["error"] = repr(e)[:300]
    if not SMOKE:
        torch.cuda.empty_cache()
    return row


def run_subject(subject: Subject) -> list[dict]:
    rows = []
    err = check_fused(subject)
    print(
        f"{subject.name}: rules fired {subject.fired}; fused vs unfused forward rel. RMS {err:.2e}",
        flush=True,
    )
    for backward in (False, True):
        for impl in IMPLS:
            row = measure(subject, impl, backward)
            row["fused_rel_err"] = err
            rows.append(row)
            print(fmt_row(row), flush=True)
    return rows


# ---- reporting ----------------------------------------------------------------------------------


def fmt_row(r: dict) -> str:
    mode = "fwd+bwd" if r["backward"] else "fwd"
    if "error" in r:
        return f"{r['group']:32s} {mode:8s} {r['impl']:8s} ERROR {r['error'][:90]}"
    return (
        f"{r['group']:32s} {mode:8s} {r['impl']:8s} {r['ms']:9.3f} ms {r['launches']:6d} launches "
        f"({r['launches_per_block']:.0f} per block)"
    )


def tables(rows: list[dict]) -> str:
    """Markdown: per (subject, mode) the three times, fused speed-ups and launches per block."""
    by = {}
    for r in rows:
        by.setdefault((r["group"], r["backward"]), {})[r["impl"]] = r
    head = (
        "| subject | mode | unfused ms | fused ms | compile ms | fused vs unfused | fused vs compile "
        "| launches/block unfused | fused | compile | kernel ms unfused | fused | compile |"
    )
    lines = [head, "|" + "---|" * 13]
    for (group, bw), impls in by.items():
        ms = [impls.get(i, {}).get("ms") for i in IMPLS]
        lb = [impls.get(i, {}).get("launches_per_block") for i in IMPLS]
        km = [impls.get(i, {}).get("kernel_ms") for i in IMPLS]
        cells = [
            group,
            "fwd+bwd" if bw else "fwd",
            *(_num(x, ".3f") for x in ms),
            _ratio(ms[0], ms[1]),
            _ratio(ms[2], ms[1]),
            *(_num(x, ".0f") for x in lb),
            *(_num(x, ".3f") for x in km),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(x, spec: str) -> str:
    return format(x, spec) if x is not None else "—"


def _ratio(slow, fast) -> str:
    return f"{slow / fast:.2f}×" if slow and fast else "—"


def write(rows: list[dict], meta: dict) -> None:
    out = os.environ.get("OUT", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "blocks.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    with open(os.path.join(out, "blocks.md"), "w") as f:
        f.write(tables(rows) + "\n")


def main() -> None:
    compile_blocks = os.environ.get("COMPILE", "1") != "0"
    meta = {"versions": harness.versions(), "fired": {}}
    rows: list[dict] = []
    for name in selected():
        t0 = time.perf_counter()
        try:
            if name == "model":
                subject = model_subject(os.environ.get("MODEL_COMPILE", "0") == "1")
            else:
                subject = block_subject(name, compile_blocks)
            meta["fired"][subject.name] = subject.fired
            rows += run_subject(subject)
        except Exception as e:
            traceback.print_exc()
            rows.append({"group": name, "impl": "setup", "backward": False, "error": repr(e)[:300]})
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
        subject = None
        if not SMOKE:
            torch.cuda.empty_cache()
        write(rows, meta)
    print()
    print(meta["versions"])
    print(tables(rows))


if __name__ == "__main__":
    main()
