"""Training throughput on a lent GPU: tokens/s, MFU, the trainer's overhead, peak memory vs the estimate.

For each model and context T, at `--tokens` tokens per step (B = tokens / T rows; one packed row for
the trainer), in bf16 with fp32 master weights:

* `trainer`: `lt2dsl.train.run` on a synthetic token file (random ids, one document per 8k
  tokens, so packed rows carry `cu_seqlens`) — tok/s and MFU from its last metrics row, the peak
  memory the CUDA allocator held against the trainer's own `estimate.json`, and the time of one
  checkpoint save amortised over `--ckpt-interval` steps;
* `bare`: the same model pieces, batches and optimizer in a plain loop (forward to the hidden
  states, chunked loss, backward, clip, AdamW step) — `overhead` = 1 − bare / trainer step time
  is what the trainer adds (data, logging, bookkeeping);
* `hf`: transformers' `LlamaForCausalLM` of the same shape in the same plain loop (llama rows);
* `fla`: fla's `GatedDeltaNetForCausalLM` of the peer's shape where fla imports (gdn12 rows).

MFU = tok/s × the estimate's training FLOPs per token / the card's dense bf16 peak
(`lt2dsl/cost/hw`), for every implementation alike. Results: `<out>/train_throughput.{json,md}`,
the table printed last, the card named in both.

    python bench/train_throughput.py --out bench/results/train            # on the GPU
    python bench/train_throughput.py --smoke --out /tmp/train_bench       # CPU, toy sizes, no claims
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gdn12 import GDN12  # noqa: E402
from lt2dsl.train import checkpoint as ckpt  # noqa: E402
from lt2dsl.train.loop import Trainer, run  # noqa: E402
from lt2dsl.train.metrics import peak_flops, train_flops_per_token  # noqa: E402
from lt2dsl.train.optim import OptimConfig, build_optimizer  # noqa: E402
from lt2dsl.train.parallel import Dist, TrainModel, WithLoss  # noqa: E402

MODELS = {
    "gdn12": {"text": GDN12, "hf": None, "fla": True},
    "hybrid": {"file": ROOT / "examples" / "lt2_hybrid_gdn_dsa.lt2", "hf": None, "fla": False},
    "llama": {"file": ROOT / "examples" / "llama_baseline.lt2", "hf": "llama", "fla": False},
}
TOY = {"dim": 64, "vocab": 512, "heads": 2, "kv_heads": 1, "head_dim": 32, "mlp": "swiglu(hidden=128)"}


def args_of(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", default="gdn12,hybrid,llama")
    p.add_argument("--contexts", default="2048,8192,32768")
    p.add_argument("--tokens", type=int, default=32768, help="tokens per optimizer step")
    p.add_argument("--steps", type=int, default=30, help="trainer steps (metrics every steps/3)")
    p.add_argument("--bare-steps", type=int, default=10)
    p.add_argument("--ckpt-interval", type=int, default=500, help="steps a checkpoint save is amortised over")
    p.add_argument("--compile", action="store_true", help="torch.compile every block")
    p.add_argument("--smoke", action="store_true", help="CPU, toy sizes: the script runs; no claims")
    return p.parse_args(argv)


# ---- the run's inputs -----------------------------------------------------------------------------


def model_file(name: str, out: Path) -> Path:
    spec = MODELS[name]
    if "file" in spec:
        return spec["file"]
    path = out / f"{name}.lt2"
    path.write_text(spec["text"])
    return path


def token_file(out: Path, vocab: int, n_tokens: int, doc: int) -> Path:
    """A prepared token folder of random ids (`data.tokens`), one document every `doc` tokens."""
    folder = out / "tokens" / f"v{vocab}-n{n_tokens}-d{doc}"
    if (folder / "meta.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    meta = {"vocab_size": vocab, "tokenizer": "random"}
    for split, n in (("train", n_tokens), ("val", 4 * doc + 1)):
        rng.integers(0, vocab, n, dtype=np.int64).astype(dtype).tofile(folder / f"{split}.bin")
        np.arange(0, n, doc, dtype=np.int64).tofile(folder / f"{split}.docs.bin")
        meta[split] = {"dtype": np.dtype(dtype).name, "tokens": n, "documents": -(-n // doc)}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def resolved(name: str, smoke: bool, out: Path):
    """The resolved model (its settings size the token file and the peers' twins)."""
    from lt2dsl.lowering import resolve_source

    return resolve_source(model_file(name, out), dict(TOY) if smoke else {})


def config(a, name: str, T: int, out: Path) -> dict:
    rows = max(1, a.tokens // T)
    vocab = resolved(name, a.smoke, out).config.vocab
    folder = token_file(out, vocab, (a.steps + 2) * rows * T + 1, doc=min(T, 8192))
    return {
        "model": {"file": str(model_file(name, out)), "set": dict(TOY) if a.smoke else {}, "backend": "auto"},
        "data": {"tokens": str(folder), "seq_len": T},
        "training": {
            "steps": a.steps,
            "batch_size": rows,
            "precision": "fp32" if a.smoke else "bf16",
            "activation_checkpoint": "none" if a.smoke or T <= 2048 else "per_application",
            "compile": a.compile,
            "out": str(out / f"{name}-{T}"),
            "device": "cpu" if a.smoke else "cuda",
        },
        "checkpoint": {"enable": False},
        "metrics": {"log_interval": max(1, a.steps // 3), "eval_rows": 1, "progress": False, "plot": False},
    }


# ---- measurements ---------------------------------------------------------------------------------


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gib() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def reset_peak() -> None:
    gc.collect()  # the previous measurement's model and optimizer
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def measure_trainer(cfg: dict, a) -> dict:
    """tok/s and MFU of the trainer's last metrics row, its peak memory against its estimate."""
    reset_peak()
    result = run(cfg)
    last = [r for r in result.rows if "tps" in r][-1]
    est = json.loads((Path(cfg["training"]["out"]) / "estimate.json").read_text())["memory_bytes"]
    checkpointed = cfg["training"]["activation_checkpoint"] == "per_application"
    return {
        "tok_s": last["tps"],
        "mfu": last["mfu"],
        "data_pct": last["data_loading(%)"],
        "peak_gib": peak_gib(),
        "estimate_gib": est["total_checkpointed" if checkpointed else "total"] / 2**30,
    }


def measure_checkpoint(cfg: dict) -> float:
    """Seconds of one checkpoint save of this model (weights, optimizer, loader, RNG)."""
    from lt2dsl.train.config import validate

    trainer = Trainer(validate(cfg), Dist(0, 1, torch.device(cfg["training"]["device"])))
    t0 = time.perf_counter()
    ckpt.save(trainer.out / "ckpt_probe", 1, 0, trainer.state, trainer.d)
    sync()
    return time.perf_counter() - t0


def bare_loop(step_fn, batches: list, steps: int, warm: int = 3) -> float:
    """Seconds per step of `step_fn(batch)` after `warm` steps."""
    for b in batches[:warm]:
        step_fn(b)
    sync()
    t0 = time.perf_counter()
    for i in range(steps):
        step_fn(batches[i % len(batches)])
    sync()
    return (time.perf_counter() - t0) / steps


def measure_bare(cfg: dict, a) -> dict:
    """The trainer's own pieces (model, loss, optimizer) in a plain loop over pre-read batches."""
    from lt2dsl.train.build import build_data, build_model, shard_of
    from lt2dsl.train.config import validate

    c = validate(cfg)
    device = torch.device(c.training.device)
    model = build_model(c).to(device)
    tm = TrainModel(model, c.training.activation_checkpoint == "per_application")
    fwd = WithLoss(tm, c.training.loss_chunk, torch.float32 if a.smoke else torch.bfloat16)
    opt = build_optimizer(tm, OptimConfig())
    data = build_data(c, shard_of(c, 1, 0), model.config.vocab, True, lambda: None)
    batches = [[b.to(device) for b in data.train.next_step()] for _ in range(4)]

    def step(micro):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not a.smoke):
            for b in micro:
                fwd(b.input_ids, b.labels, b.cu_seqlens).backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    reset_peak()
    s = bare_loop(step, batches, a.bare_steps)
    tokens = sum(b.input_ids.numel() for b in batches[0])
    return {"tok_s": tokens / s, "peak_gib": peak_gib()}


def hf_llama(ir):
    """transformers' LlamaForCausalLM of `ir`'s shape (fp32 master weights), or None without transformers."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ModuleNotFoundError:
        return None
    c = ir.config
    mixer = next(iter(_blocks(ir)))[0].mixers[0].opts
    conf = LlamaConfig(
        vocab_size=c.vocab,
        hidden_size=c.dim,
        intermediate_size=next(iter(_blocks(ir)))[0].mlp.hidden,
        num_hidden_layers=sum(it for _, it in _blocks(ir)),
        num_attention_heads=mixer["heads"],
        num_key_value_heads=mixer["kv_heads"],
        head_dim=mixer["head_dim"],
        rope_theta=float(mixer["rope_theta"]),
        rms_norm_eps=c.norm.eps,
        tie_word_embeddings=c.tie_embeddings,
        max_position_embeddings=max(c.max_len, 32768),
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(conf)


def fla_gdn(ir):
    """fla's GatedDeltaNetForCausalLM of the gdn12 shape, or None where fla does not import."""
    try:
        from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM
    except Exception:  # fla missing, or its Triton version refused at import
        return None
    c = ir.config
    opts = next(iter(_blocks(ir)))[0].mixers[0].opts
    conf = GatedDeltaNetConfig(
        hidden_size=c.dim,
        num_hidden_layers=sum(it for _, it in _blocks(ir)),
        num_heads=opts["heads"],
        head_dim=opts["head_dim"],
        expand_v=opts["expand_v"],
        vocab_size=c.vocab,
        intermediate_size=next(iter(_blocks(ir)))[0].mlp.hidden,
        tie_word_embeddings=c.tie_embeddings,
        fuse_cross_entropy=True,
    )
    return GatedDeltaNetForCausalLM(conf)


def _blocks(ir):
    from lt2dsl.passes.resolve import blocks

    return blocks(ir.body)


def measure_peer(model, cfg: dict, a) -> dict:
    """A Hugging Face-style model (`model(input_ids, labels=...)` returns `.loss`) in the plain loop."""
    device = torch.device(cfg["training"]["device"])
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    T, rows = cfg["data"]["seq_len"], cfg["training"]["batch_size"]
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (rows, T), generator=g).to(device) for _ in range(4)]

    def step(ids):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not a.smoke):
            model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    reset_peak()
    try:
        s = bare_loop(step, batches, a.bare_steps)
    except torch.OutOfMemoryError:
        return {"tok_s": None, "note": "OOM"}
    finally:
        model.to("cpu")  # whatever happened, free the card for the next row
    return {"tok_s": rows * T / s, "peak_gib": peak_gib()}


# ---- the table ------------------------------------------------------------------------------------


def rows_for(a, name: str, T: int, out: Path, hw: tuple[str, float]) -> list[dict]:
    cfg = config(a, name, T, out)
    ir = resolved(name, a.smoke, out)
    flops = train_flops_per_token(ir, T)
    base = {"model": name, "T": T, "B": cfg["training"]["batch_size"], "flops_per_token": flops}
    out_rows = []
    try:
        trainer = measure_trainer(cfg, a)
    except torch.OutOfMemoryError:
        return [{**base, "impl": "trainer", "note": "OOM"}]
    bare = measure_bare(cfg, a)
    save_s = measure_checkpoint(cfg)
    step_s = a.tokens / trainer["tok_s"]
    trainer["overhead_pct"] = 100 * (1 - bare["tok_s"] ** -1 / trainer["tok_s"] ** -1)
    trainer["ckpt_pct"] = 100 * save_s / (a.ckpt_interval * step_s)
    out_rows += [{**base, "impl": "trainer", **trainer}, {**base, "impl": "bare", **bare}]
    peers = {
        "hf": hf_llama(ir) if MODELS[name]["hf"] else None,
        "fla": fla_gdn(ir) if MODELS[name]["fla"] else None,
    }
    for impl, model in peers.items():
        if model is not None:
            out_rows.append({**base, "impl": impl, **measure_peer(model, cfg, a)})
            del model
    for r in out_rows:
        if r.get("tok_s"):
            r["mfu"] = 100 * r["tok_s"] * flops / hw[1]
    return out_rows


def markdown(rows: list[dict], card: str) -> str:
    head = "| model | T | B | impl | tok/s | MFU % | overhead % | data % | ckpt % | peak GiB | estimate GiB |"
    lines = [f"Card: {card}", "", head, "|" + "---|" * 11]

    def f(x, fmt):
        return "—" if x is None else format(x, fmt)

    cols = (
        ("tok_s", ",.0f"),
        ("mfu", ".1f"),
        ("overhead_pct", ".1f"),
        ("data_pct", ".1f"),
        ("ckpt_pct", ".2f"),
    )
    cols += (("peak_gib", ".2f"), ("estimate_gib", ".2f"))
    for r in rows:
        cells = [str(r[k]) for k in ("model", "T", "B", "impl")] + [f(r.get(k), fmt) for k, fmt in cols]
        lines.append("| " + " | ".join(cells) + " |" + (f" {r['note']}" if r.get("note") else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    a = args_of(argv)
    if not a.smoke and not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA device (or --smoke for the CPU dry run)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if a.smoke else "cuda")
    card = "cpu (smoke: no claims)" if a.smoke else torch.cuda.get_device_name(device)
    hw = peak_flops(device, "fp32" if a.smoke else "bf16", None)
    rows: list[dict] = []
    for name in a.models.split(","):
        for T in (int(t) for t in a.contexts.split(",")):
            rows += rows_for(a, name, T, a.out, hw)
            (a.out / "train_throughput.json").write_text(
                json.dumps({"card": card, "peak": hw, "rows": rows}, indent=1)
            )
    table = markdown(rows, card)
    (a.out / "train_throughput.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
