"""GPU only: issue 35's decode comparison, in one process (one card, one run).

1. The 12-layer GDN model (dim 1024, the peer's `GatedDeltaNetForCausalLM` shape) through lt2dsl's
   engine, against the peer's `generate` (fla) and HF `LlamaForCausalLM` of the same shape, eager and
   with its fastest path (`cache_implementation="static"`, `torch.compile(mode="reduce-overhead")`;
   a peer path that fails in its own stack is recorded with its error), batch 1,
   decode tok/s after a prompt of `--ctx` tokens (the issue asks for lt2dsl ≥ 10× the peer and
   ≥ 1.5× Llama).
2. The looped examples (GDN+DSA hybrid, Ouro-like baseline) at 4k/8k/32k and batch 1/8/32 through
   `lt2dsl.engine.bench` (measured tok/s next to the estimate, out-of-memory points), JSON + PNG, and
   the GDN+DSA / Ouro speed ratio at 8k against the estimate's; `ratio.png`: that ratio against
   context per batch, measured and estimated (2k to 128k), with the research's 5.7x and the first
   context at which each batch's estimate passes it or the baseline runs out of memory.
3. Steady memory: `torch.cuda.memory_allocated()` before and after 100 decode steps.
4. First call: a fresh process's first `generate` against its second, after a warm-up process
   filled the on-disk autotune cache (`lt2dsl warmup`).

Usage (repository root, a CUDA machine with fla and transformers installed):
    python bench/decode_compare.py --out /tmp/decode_compare [--ctx 4096] [--new 128] [--skip-peers]
        [--parts gdn,looped,memory,first]
Writes OUT/compare.json, OUT/looped.json, OUT/looped.png and OUT/ratio.png; prints rich tables.
`--replot LOOPED_JSON` rebuilds the two plots of a saved `looped.json` (no GPU needed).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lt2dsl  # noqa: E402
from bench.gdn12 import GDN12  # noqa: E402
from lt2dsl.cost.hardware import load_hardware  # noqa: E402
from lt2dsl.engine import Engine, bench  # noqa: E402
from lt2dsl.engine.report import PAPER_RATIO, measured_ratios, plot, ratio_plot, table  # noqa: E402

LOOPED = ("lt2_hybrid_gdn_dsa", "ouro_looped_transformer")
PARTS = ("gdn", "looped", "memory", "first")  # the numbered steps of the docstring, in order
RATIO_CONTEXTS = tuple(2**k for k in range(11, 18))  # 2k … 128k, the ratio plot's estimate
FIRST_CALL = """
import sys, time, torch
sys.path.insert(0, {root!r})
import lt2dsl
m = lt2dsl.compile({src!r}, device="cuda", dtype=torch.bfloat16).eval()
ids = torch.zeros(1, {ctx}, dtype=torch.long, device="cuda")
times = []
for _ in range(2):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    m.generate(ids, 16)
    torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
print(times[0], times[1])
"""


def sync() -> None:
    torch.cuda.synchronize()


def timed(fn) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def decode_rate(generate, new: int) -> float:
    """tok/s of `new` decode steps at batch 1: generate(new + 1) minus generate(1) (the prefill and
    first token), each the best of two runs after a warm-up pair."""
    generate(1), generate(new + 1)
    one = min(timed(lambda: generate(1)) for _ in range(2))
    many = min(timed(lambda: generate(new + 1)) for _ in range(2))
    return new / (many - one)


def lt2dsl_rate(ids, new: int) -> tuple[float, int]:
    model = lt2dsl.compile(GDN12, device="cuda", dtype=torch.bfloat16).eval()
    engine = Engine(model)
    rate = decode_rate(lambda n: engine.generate(ids, n), new)
    return rate, sum(p.numel() for p in model.parameters())


def fla_rate(ids, new: int) -> tuple[float, int]:
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    cfg = GatedDeltaNetConfig(
        hidden_size=1024, num_hidden_layers=12, num_heads=8, head_dim=128, expand_v=2,
        intermediate_size=2816, vocab_size=32000, tie_word_embeddings=True,
    )  # fmt: skip
    model = GatedDeltaNetForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    kw = dict(do_sample=False, use_cache=True)
    rate = decode_rate(lambda n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw), new)
    return rate, sum(p.numel() for p in model.parameters())


def llama_model(ctx: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=True, max_position_embeddings=ctx,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()


def llama_eager_rate(ids, new: int) -> tuple[float, int]:
    """HF Llama's default path: eager modules, dynamic cache (the issue's own baseline row)."""
    model = llama_model(ids.shape[1] + new + 8)
    kw = dict(do_sample=False, use_cache=True)
    rate = decode_rate(lambda n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw), new)
    return rate, sum(p.numel() for p in model.parameters())


def llama_compiled_rate(ids, new: int) -> tuple[float, int]:
    """HF Llama's fastest documented path: a static cache, whose decoding steps `generate` compiles
    itself (`generation_config.compile_config`: `torch.compile(mode="reduce-overhead")`, CUDA
    graphs) while the prefill runs eager. Compiling `model.forward` by hand as well sends prefill
    and decode through one CUDA-graph pool, and the first decode step overwrites the prefill's
    logits (the RuntimeError of the H100 run of 2026-12-06)."""
    from transformers import CompileConfig

    model = llama_model(ids.shape[1] + new + 8)
    model.generation_config.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
    kw = dict(do_sample=False, cache_implementation="static")
    rate = decode_rate(lambda n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw), new)
    if getattr(model, "_compiled_call", None) is None:
        raise RuntimeError("generate ran the static cache uncompiled (its auto-compile criteria failed)")
    return rate, sum(p.numel() for p in model.parameters())


PEERS = (
    ("fla (peer) generate", fla_rate),
    ("HF Llama eager", llama_eager_rate),
    ("HF Llama static + compile", llama_compiled_rate),
)


def gdn_vs_peers(ctx: int, new: int, skip_peers: bool, peers=PEERS, device: str = "cuda") -> dict:
    """tok/s per path; a peer that cannot run here (not installed, or failing inside its own stack)
    is recorded with its error instead of ending the comparison."""
    ids = torch.randint(0, 32000, (1, ctx), generator=torch.Generator().manual_seed(0)).to(device)
    rows = {"lt2dsl": (*lt2dsl_rate(ids, new), None)}
    for name, fn in () if skip_peers else peers:
        try:
            rows[name] = (*fn(ids, new), None)
        except Exception as e:  # a peer failing inside its own stack is a result, not the end of the run
            rows[name] = (float("nan"), 0, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
            print(f"{name} failed: {rows[name][2]}", file=sys.stderr)
        free()
    ours = rows["lt2dsl"][0]
    return {
        name: {"tok_s": r, "params": p, "lt2dsl_speedup": ours / r, "error": err}
        for name, (r, p, err) in rows.items()
    }


def free() -> None:
    """Return the memory of models dropped so far: a traced `torch.fx.GraphModule` and its `Graph`
    refer to each other, so a dropped model's weights wait for the cyclic collector."""
    gc.collect()
    torch.cuda.empty_cache()


def looped(out: Path, contexts, batches, hw: str) -> tuple[list[dict], dict]:
    """One model on the card at a time, as the estimate's largest batch assumes."""
    plan = bench.Plan(tuple(contexts), tuple(batches), 32, 4, load_hardware(hw))
    rows = []
    for stem in LOOPED:
        model = lt2dsl.compile(ROOT / "examples" / f"{stem}.lt2", device="cuda", dtype=torch.bfloat16).eval()
        rows += bench.run([(stem, model)], plan, lambda what: print(what, file=sys.stderr))
        del model
        free()
    info = bench.meta(torch.device("cuda"), plan, torch.bfloat16)
    bench.write_json(out / "looped.json", info, rows)
    plot(out / "looped.png", rows, info)
    Console(width=160).print(table(rows, info))
    return rows, info


def ratio_report(out: Path, rows: list[dict], info: dict) -> dict:
    """GDN+DSA over Ouro against context: the estimate's curve on the card `info["hw"]` (models on
    the meta device, in bf16), the measured ratios, each batch's first passing context, ratio.png."""
    fast, slow = (
        lt2dsl.compile(ROOT / "examples" / f"{s}.lt2", device="meta", dtype=torch.bfloat16) for s in LOOPED
    )
    batches = sorted({r["batch"] for r in rows})
    curve = bench.ratio_curve(fast, slow, batches, RATIO_CONTEXTS, load_hardware(info["hw"]))
    measured = measured_ratios(rows, *LOOPED)
    ratio_plot(out / "ratio.png", curve, measured, info, LOOPED)
    first = bench.passes(curve, PAPER_RATIO)
    t = Table(title=f"{LOOPED[0]} / {LOOPED[1]} decode speed, estimate for {info['hw']} (measured)")
    t.add_column("B")
    for ctx in RATIO_CONTEXTS:
        t.add_column(f"{ctx // 1024}k", justify="right")
    t.add_column(f"passes {PAPER_RATIO}x")
    for batch in batches:
        cells = []
        for ctx in RATIO_CONTEXTS:
            e = next(r for r in curve if r["batch"] == batch and r["ctx"] == ctx)
            m = next((x for x in measured if x["batch"] == batch and x["ctx"] == ctx), None)
            cell = f"{e['estimate']:.2f}" if e["estimate"] else ("OOM" if not e["fast_fits"] else "base OOM")
            if m is not None:
                cell += f" ({m['measured']:.2f})" if m["measured"] else " (base OOM)"
            cells.append(cell)
        p = first.get(batch)
        t.add_row(str(batch), *cells, f"{p['ctx'] // 1024}k: {p['why']}" if p else "no")
    Console(width=200).print(t)
    return {"curve": curve, "measured": measured, "passes": {str(b): v for b, v in first.items()}}


def replot(path: Path, out: Path) -> None:
    """looped.png and ratio.png (and ratio.json) of a saved looped.json."""
    saved = json.loads(path.read_text())
    rows = saved.pop("points")
    out.mkdir(parents=True, exist_ok=True)
    plot(out / "looped.png", rows, saved)
    result = ratio_report(out, rows, saved)
    bench.write_atomic(
        out / "ratio.json", lambda tmp: Path(tmp).write_text(json.dumps(result, indent=1) + "\n")
    )


def ratio_at(rows: list[dict], ctx: int) -> list[dict]:
    """GDN+DSA / Ouro decode speed at `ctx` per batch, measured (None where Ouro ran out of
    memory) and estimated."""
    est = {(r["model"], r["batch"]): r["estimate_tok_s"] for r in rows if r["ctx"] == ctx}
    return [
        {
            "batch": m["batch"],
            "measured": m["measured"],
            "estimate": est[LOOPED[0], m["batch"]] / est[LOOPED[1], m["batch"]],
        }
        for m in measured_ratios(rows, *LOOPED)
        if m["ctx"] == ctx
    ]


def steady_memory(steps: int = 100) -> dict:
    model = lt2dsl.compile(GDN12, device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.zeros(1, 512, dtype=torch.long, device="cuda")
    stream = Engine(model).stream(ids, steps + 11)
    for _ in range(10):
        next(stream)
    sync()
    before = torch.cuda.memory_allocated()
    for _ in range(steps):
        next(stream)
    sync()
    return {"before": before, "after": torch.cuda.memory_allocated(), "steps": steps}


def first_call(ctx: int) -> dict:
    """Warm-up process (fills the autotune cache), then a fresh process's first and second call."""
    code = FIRST_CALL.format(root=str(ROOT), src=GDN12, ctx=ctx)

    def run() -> str:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    run()
    first, second = (float(x) for x in run().split())
    return {"first_s": first, "second_s": second, "extra_s": first - second}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="decode_compare", help="output folder [decode_compare]")
    p.add_argument("--ctx", type=int, default=4096, help="prompt length of the GDN comparison [4096]")
    p.add_argument("--new", type=int, default=128, help="decode steps timed [128]")
    p.add_argument("--hw", default="h100", help="estimate preset for the card [h100]")
    p.add_argument("--skip-peers", action="store_true", help="lt2dsl only (no fla / transformers)")
    p.add_argument("--replot", type=Path, help="a saved looped.json: rebuild its plots into --out only")
    p.add_argument("--parts", default=",".join(PARTS), help=f"which of {','.join(PARTS)} to run [all]")
    args = p.parse_args()
    parts = [x for x in args.parts.split(",") if x]
    if not parts or set(parts) - set(PARTS):
        known = ",".join(PARTS)
        raise SystemExit(f"error: --parts takes a comma-separated subset of {known}; got {args.parts!r}")
    if args.replot is not None:
        replot(args.replot, Path(args.out))
        return
    if not torch.cuda.is_available():
        raise SystemExit("error: decode_compare needs a CUDA device")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ctx": args.ctx}
    if "gdn" in parts:
        result["gdn12"] = gdn_vs_peers(args.ctx, args.new, args.skip_peers)
        free()
        t = Table(title=f"12-layer GDN shape, batch 1, context {args.ctx}, {result['device']}")
        for col in ("model", "params (M)", "decode tok/s", "lt2dsl speed-up"):
            t.add_column(col)
        for name, r in result["gdn12"].items():
            speed = f"{r['tok_s']:.1f}" if r["error"] is None else f"failed: {r['error'][:60]}"
            t.add_row(name, f"{r['params'] / 1e6:.1f}", speed, f"{r['lt2dsl_speedup']:.2f}x")
        Console(width=160).print(t)
    if "looped" in parts:
        rows, info = looped(out, (4096, 8192, 32768), (1, 8, 32), args.hw)
        result["gdn_dsa_over_ouro_8k"] = ratio_at(rows, 8192)
        result["ratio"] = ratio_report(out, rows, info)
    if "memory" in parts:
        result["steady_memory"] = steady_memory()
    if "first" in parts:
        result["first_call"] = first_call(args.ctx)
    (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    keys = ("gdn_dsa_over_ouro_8k", "steady_memory", "first_call")
    print(json.dumps({k: result[k] for k in keys if k in result}, indent=2))


if __name__ == "__main__":
    main()
