"""GPU benchmark of whole-model decode: tokens/s per decode step against context length.

The research's headline (README of the research notes, BENCHMARKS.md): an LT2 model's decode
throughput stays flat from 4k to 32k context while a standard looped transformer (softmax
attention in every looped layer) loses over half of it and runs out of memory at large batch.
For each model, batch and context L: one prefill of L tokens through a cache reserved for
L + STEPS tokens (`new_cache(B, max_len=...)`), then STEPS single-token decode steps timed with
CUDA events (the mean step, after WARM steps), next to what `lt2dsl compile --estimate` predicts
for that model, batch and context on the same GPU preset. A prefill or step that runs out of
memory is recorded as OOM and the larger contexts of that model and batch are skipped.

Both models are lowered with `backend="auto"` in bf16: the mixers' Triton kernels on CUDA.

Usage:
    PYTHONPATH=. python bench/decode.py
Environment: MODELS (example stems, default `lt2_hybrid_gdn_dsa,ouro_looped_transformer`),
CONTEXTS (default 4096,8192,16384,32768), BATCHES (default 1,8), STEPS (32), WARM (4),
FUSE=0 (unfused graph), SMOKE=1 (CPU dry run at toy sizes: no timing claims, for CI).
Writes $OUT/decode.json after every measurement and prints the table last.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lt2dsl
from lt2dsl.cost.estimate import EstimateOptions, estimate
from lt2dsl.cost.hardware import load_hardware

SMOKE = os.environ.get("SMOKE") == "1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# toy sizes for the CPU dry run: every code path, no meaningful numbers
TOY = dict(dim=64, heads=2, head_dim=32, vocab=256)


def env_list(name: str, default: str) -> list[str]:
    return [s for s in os.environ.get(name, default).split(",") if s]


def build(stem: str):
    """The lowered model (bf16 on CUDA; fp32 on the CPU for SMOKE) and its resolved IR."""
    path = os.path.join(ROOT, "examples", f"{stem}.lt2")
    device, dtype = ("cpu", torch.float32) if SMOKE else ("cuda", torch.bfloat16)
    overrides = dict(TOY) if SMOKE else {}
    model = lt2dsl.compile(
        path, device=device, dtype=dtype, fuse=os.environ.get("FUSE", "1") != "0", **overrides
    )
    return model.eval(), model.ir


def predicted(ir, batch: int, L: int) -> float:
    """Decode tokens/s the estimate's roofline gives at this batch and context (H200 preset)."""
    rep = estimate(ir, EstimateOptions(seq=L, batch=batch, hw=load_hardware("h200")))
    return rep.roofline.decode_tokens_per_s


def _sync() -> None:
    if torch.cuda.is_available() and not SMOKE:
        torch.cuda.synchronize()


@torch.no_grad()
def measure(model, batch: int, L: int, steps: int, warm: int) -> dict:
    """Prefill L tokens, then time `steps` decode steps (after `warm` untimed ones)."""
    vocab = model.config.vocab
    gen = torch.Generator(device="cpu").manual_seed(0)
    device = model.embed.weight.device
    ids = torch.randint(0, vocab, (batch, L), generator=gen).to(device)
    cache = model.new_cache(batch, max_len=L + warm + steps)
    if not SMOKE:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    logits = model(ids, cache)
    _sync()
    prefill_s = time.perf_counter() - t0
    nxt = logits[:, -1:].argmax(-1)
    for _ in range(warm):
        nxt = model(nxt, cache)[:, -1:].argmax(-1)
    _sync()
    if SMOKE:
        t0 = time.perf_counter()
        for _ in range(steps):
            nxt = model(nxt, cache)[:, -1:].argmax(-1)
        step_ms = (time.perf_counter() - t0) / steps * 1e3
        peak = 0
    else:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            nxt = model(nxt, cache)[:, -1:].argmax(-1)
        end.record()
        torch.cuda.synchronize()
        step_ms = start.elapsed_time(end) / steps
        peak = torch.cuda.max_memory_allocated()
    return dict(
        prefill_s=prefill_s,
        step_ms=step_ms,
        tok_s=batch / step_ms * 1e3,
        cache_gb=cache.nbytes() / 1e9,
        peak_gb=peak / 1e9,
        seen=cache.seen,
    )


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def table(rows: list[dict]) -> str:
    head = (
        "| model | B | L | decode ms/step | tok/s | vs shortest L | estimate tok/s | cache GB | peak GB "
        "| prefill s |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    base = {}
    lines = [head]
    for r in rows:
        key = (r["model"], r["batch"])
        if "error" in r:
            lines.append(
                f"| {r['model']} | {r['batch']} | {r['L']} | {r['error']} | | | "
                f"{r['predicted_tok_s']:.0f} | | | |"
            )
            continue
        base.setdefault(key, r["tok_s"])
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['L']} | {r['step_ms']:.2f} | {r['tok_s']:.0f} | "
            f"{r['tok_s'] / base[key]:.2f} | {r['predicted_tok_s']:.0f} | {r['cache_gb']:.2f} | "
            f"{r['peak_gb']:.1f} | {r['prefill_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    models = env_list("MODELS", "lt2_hybrid_gdn_dsa,ouro_looped_transformer")
    contexts = [int(x) for x in env_list("CONTEXTS", "64,128" if SMOKE else "4096,8192,16384,32768")]
    batches = [int(x) for x in env_list("BATCHES", "1" if SMOKE else "1,8")]
    steps = int(os.environ.get("STEPS", "3" if SMOKE else "32"))
    warm = int(os.environ.get("WARM", "1" if SMOKE else "4"))
    meta = dict(
        device="cpu (smoke)" if SMOKE else torch.cuda.get_device_name(),
        torch=torch.__version__,
        steps=steps,
        warm=warm,
        fuse=os.environ.get("FUSE", "1") != "0",
    )
    rows: list[dict] = []
    for stem in models:
        model, ir = build(stem)
        for batch in batches:
            for L in contexts:
                row = dict(model=stem, batch=batch, L=L, predicted_tok_s=predicted(ir, batch, L))
                try:
                    row |= measure(model, batch, L, steps, warm)
                except (torch.OutOfMemoryError, RuntimeError) as e:
                    if not is_oom(e):
                        raise
                    row["error"] = "OOM"
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(os.path.join(out_dir, "decode.json"), "w") as f:
                    json.dump(dict(meta=meta, rows=rows), f, indent=1)
                if not SMOKE:
                    torch.cuda.empty_cache()
                if "error" in row:
                    break  # larger contexts of this model and batch would not fit either
        del model
    print(table(rows))


if __name__ == "__main__":
    main()
