"""`lt2dsl bench decode`: measured decode tokens/s against context, next to the estimate's.

For each model, batch B and context L, through the model's `Engine`:

1. a first `generate` at that shape, timed whole (`first_s`: cache allocation, CUDA-graph capture,
   any autotuning the on-disk cache does not hold, prefill and one step);
2. a stream of `warm + steps` new tokens after a prompt of L tokens: the prefill timed alone
   (`prefill_s`), `warm` untimed steps, then `steps` steps timed together (`step_ms`, tok/s =
   B / step time, and the bandwidth: the bytes the estimate says a step must read — every weight
   once per application, so T times in a loop of T, and the cache a step addresses (a DSA or NSA
   step reads its selection, not the whole cache) — over the measured step time, next to the
   card's HBM peak), each timing between device synchronisations;
3. the estimate for the same card, dtype, batch and context: `roofline.decode_tokens_per_s` and
   `capacity.max_batch` (the largest batch whose cache fits next to the weights).

A point that runs out of memory is recorded as `oom` next to the estimate's largest batch, and the
larger contexts of that model and batch are skipped. `summary` condenses each (model, batch): the
range of measured / estimate, how much of its shortest context's speed the longest context keeps
next to what the estimate says it keeps (a flat estimate keeps ~1), and whether each OOM and each
point that ran is where the estimate's largest batch puts it. Models given as builders are built
at their turn and freed after it, so one model's weights never crowd another's points (the
estimate's largest batch assumes the card holds one model).
"""

from __future__ import annotations

import gc
import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lt2dsl.cost.estimate import EstimateOptions, estimate
from lt2dsl.cost.hardware import Hardware
from lt2dsl.dtypes import TABLE, Dtypes
from lt2dsl.engine.engine import Engine


@dataclass(frozen=True)
class Plan:
    """What `bench decode` measures: every (model, batch, context) point."""

    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    steps: int
    warm: int
    hw: Hardware


def dtype_name(dtype: torch.dtype) -> str:
    """The table's name of a torch dtype (`torch.bfloat16` → `bf16`)."""
    return next(d.name for d in TABLE.values() if getattr(torch, d.torch_name, None) == dtype)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def predicted(model, batch: int, ctx: int, hw: Hardware) -> dict:
    """The estimate's decode tokens/s, bytes a step reads and largest batch at this context, in the
    model's dtypes."""
    cfg, act = model.config, dtype_name(model.embed.weight.dtype)
    dt = Dtypes(act=act, state=cfg.state_dtype, kv=act)
    rep = estimate(model.ir, EstimateOptions(seq=ctx, batch=batch, hw=hw, dtypes=dt))
    return {
        "estimate_tok_s": rep.roofline.decode_tokens_per_s,
        "estimate_step_bytes": rep.roofline.decode_bytes_per_step,
        "estimate_kernels": rep.roofline.decode_kernels,
        "estimate_launch_s": rep.roofline.decode_launch_s,
        "estimate_max_batch": rep.capacity.max_batch,
    }


def ratio_curve(fast, slow, batches, contexts, hw: Hardware) -> list[dict]:
    """The estimate's decode speed of `fast` over `slow` (two models, e.g. on the meta device) at
    every (batch, context): `estimate` (None where either does not fit: its cache past the card
    next to its weights), and whether each fits (`fast_fits`, `slow_fits`: batch ≤ its largest)."""
    out = []
    for batch in batches:
        for ctx in contexts:
            f, s = predicted(fast, batch, ctx, hw), predicted(slow, batch, ctx, hw)
            fits = [batch <= x["estimate_max_batch"] for x in (f, s)]
            ratio = f["estimate_tok_s"] / s["estimate_tok_s"] if all(fits) else None
            out.append(
                {"batch": batch, "ctx": ctx, "estimate": ratio, "fast_fits": fits[0], "slow_fits": fits[1]}
            )
    return out


def passes(curve: list[dict], target: float) -> dict[int, dict]:
    """Per batch, the first context at which the estimate's speed-up reaches `target`, or at which
    only the fast model still fits (the slow one runs out of memory): {batch: {"ctx", "why"}};
    a batch that does neither is left out."""
    out: dict[int, dict] = {}
    for r in sorted(curve, key=lambda r: (r["batch"], r["ctx"])):
        if r["batch"] in out or not r["fast_fits"]:
            continue
        if r["estimate"] is not None and r["estimate"] >= target:
            out[r["batch"]] = {"ctx": r["ctx"], "why": f"estimate {r['estimate']:.2f}x"}
        elif not r["slow_fits"]:
            out[r["batch"]] = {"ctx": r["ctx"], "why": "baseline out of memory"}
    return out


def timed(device: torch.device, fn):
    """(seconds, fn()) between device synchronisations."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def measure(engine: Engine, batch: int, ctx: int, plan: Plan, step_bytes: float) -> dict:
    """One point: first-call time, prefill time and the mean decode step (module docstring);
    `step_bytes` the estimate's bytes of one step."""
    model = engine.model
    device = model.embed.weight.device
    gen = torch.Generator().manual_seed(ctx * 1000 + batch)
    ids = torch.randint(0, model.config.vocab, (batch, ctx), generator=gen).to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    first_s, _ = timed(device, lambda: engine.generate(ids, 2))
    stream = engine.stream(ids, 1 + plan.warm + plan.steps)
    prefill_s, _ = timed(device, lambda: next(stream))
    for _ in range(plan.warm):
        next(stream)
    step_s, _ = timed(device, lambda: [next(stream) for _ in range(plan.steps)])
    stream.close()
    step_ms = step_s / plan.steps * 1e3
    cache = engine.slots[engine.bucket(batch)].cache
    return {
        "tok_s": batch / step_ms * 1e3,
        "step_ms": step_ms,
        "bandwidth_gb_s": step_bytes / step_ms / 1e6,
        "prefill_s": prefill_s,
        "first_s": first_s,
        "cache_bytes": cache.nbytes(),
        "peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }


def built(entry) -> torch.nn.Module:
    """A `(name, model or builder)` entry's model: a builder (a callable that is not a module) is
    called now."""
    m = entry[1]
    return m if isinstance(m, torch.nn.Module) else m()


def run(models: list[tuple[str, object]], plan: Plan, progress=None, on_row=None) -> list[dict]:
    """Every point of `plan` for each (name, model or builder); `progress(description)` after each
    point, and `on_row(rows so far)` (e.g. to write them, so a run cut short keeps what it
    measured). A built model is dropped after its points, before the next is built."""
    rows = []
    for entry in models:
        name, model = entry[0], built(entry)
        engine = Engine(model)
        for batch in plan.batches:
            release(engine)  # one bucket's cache at a time: the others would crowd this one
            failed = None
            for ctx in plan.contexts:
                row = {"model": name, "batch": batch, "ctx": ctx, **predicted(model, batch, ctx, plan.hw)}
                rows.append(row | _point(engine, batch, ctx, plan, failed, row["estimate_step_bytes"]))
                failed = failed or ("oom" if rows[-1].get("oom") else None)
                if on_row is not None:
                    on_row(rows)
                if progress is not None:
                    progress(f"{name} B={batch} L={ctx}")
        release(engine)
        device = model.embed.weight.device
        del engine, model
        free(device)
    return rows


def free(device: torch.device) -> None:
    """After the caller dropped a model measured here and its engine: collect them (a compiled
    model holds reference cycles) and hand the allocator's blocks back on CUDA, before the next
    model is built. A model the caller passed in stays the caller's."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def release(engine: Engine) -> None:
    """Free the engine's caches and captured steps, and on CUDA hand the allocator's cached blocks
    back, so the next point starts from the memory the weights leave (an OOM is then a real one,
    not the fragments of an earlier bucket's cache)."""
    device = engine.model.embed.weight.device
    engine.release()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def warm(models: list[tuple[str, object]], batches, contexts, progress=None) -> list[dict]:
    """One generate per (model, batch, context): every prefill chunk and the decode step of each
    shape run once, so the kernels they launch are compiled and autotuned (`lt2dsl warmup`)."""
    rows = []
    for entry in models:
        name, model = entry[0], built(entry)
        engine = Engine(model)
        device = model.embed.weight.device
        for batch in batches:
            release(engine)
            for ctx in contexts:
                ids = torch.zeros(batch, ctx, dtype=torch.long, device=device)
                first_s, _ = timed(device, lambda ids=ids, engine=engine: engine.generate(ids, 2))
                rows.append({"model": name, "batch": batch, "ctx": ctx, "first_s": first_s})
                if progress is not None:
                    progress(f"{name} B={batch} L={ctx}")
        release(engine)
        del engine, model
        free(device)
    return rows


def _point(engine: Engine, batch: int, ctx: int, plan: Plan, failed: str | None, step_bytes: float) -> dict:
    if failed:
        return {"oom": True, "skipped": True}
    try:
        return measure(engine, batch, ctx, plan, step_bytes)
    except Exception as e:
        if not is_oom(e):
            raise
    # outside the handler: the exception's frames (and the tensors their locals hold) are gone
    release(engine)
    return {"oom": True}


def meta(device: torch.device, plan: Plan, dtype: torch.dtype) -> dict:
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "hw": plan.hw.name,
        "dtype": dtype_name(dtype),
        "steps": plan.steps,
        "warm": plan.warm,
    }


def summary(rows: list[dict]) -> list[dict]:
    """Per (model, batch), in the rows' order: the contexts measured (`contexts`: shortest and
    longest that ran), measured / estimate over them (`of_estimate`: lowest, highest), the longest
    context's tok/s over the shortest's (`kept`) and the estimate's (`estimate_kept`) — None where
    fewer than two ran — the contexts out of memory (`oom`, skipped ones left out) and whether the
    estimate's largest batch agrees: every OOM above it, every point that ran within it
    (`as_estimated`)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["batch"]), []).append(r)
    out = []
    for (model, batch), pts in groups.items():
        ran = sorted((p for p in pts if not p.get("oom")), key=lambda p: p["ctx"])
        oom = [p for p in pts if p.get("oom") and not p.get("skipped")]
        ratios = [p["tok_s"] / p["estimate_tok_s"] for p in ran]
        two = len(ran) >= 2
        out.append({
            "model": model,
            "batch": batch,
            "contexts": [ran[0]["ctx"], ran[-1]["ctx"]] if ran else [],
            "of_estimate": [min(ratios), max(ratios)] if ratios else [],
            "kept": ran[-1]["tok_s"] / ran[0]["tok_s"] if two else None,
            "estimate_kept": ran[-1]["estimate_tok_s"] / ran[0]["estimate_tok_s"] if two else None,
            "oom": [p["ctx"] for p in oom],
            "as_estimated": all(batch > p["estimate_max_batch"] for p in oom)
            and all(batch <= p["estimate_max_batch"] for p in ran),
        })  # fmt: skip
    return out


def write_atomic(path: str | os.PathLike, write) -> None:
    """`write(tmp_path)` into a temporary file beside `path`, then move it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the results unreadable to others
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path, info: dict, rows: list[dict], summarized: list[dict] | None = None) -> None:
    """The run's JSON: `info`, the points, and where given the `summary` of them."""
    extra = {} if summarized is None else {"summary": summarized}

    def write(tmp):
        Path(tmp).write_text(json.dumps({**info, "points": rows, **extra}, indent=2) + "\n")

    write_atomic(path, write)
