"""The plain loop of `bench/train_throughput.py` (its `bare` rows and the peers'), the device
bookkeeping around it, and the peers: transformers' Llama and fla's GatedDeltaNet of an lt2dsl
model's shape."""

from __future__ import annotations

import gc
import time

import torch


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gib() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def free_memory() -> None:
    gc.collect()  # the previous measurement's model and optimizer
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def bare_loop(step_fn, batches: list, steps: int, warm: int = 1) -> float:
    """Seconds per step of `step_fn(batch)` after `warm` steps."""
    for b in batches[:warm]:
        step_fn(b)
    sync()
    t0 = time.perf_counter()
    for i in range(steps):
        step_fn(batches[i % len(batches)])
    sync()
    return (time.perf_counter() - t0) / steps


def hf_llama(ir):
    """transformers' LlamaForCausalLM of `ir`'s shape (fp32 master weights), or None without transformers."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ModuleNotFoundError:
        return None
    c, mixer, hidden, layers = _shape(ir)
    conf = LlamaConfig(
        vocab_size=c.vocab,
        hidden_size=c.dim,
        intermediate_size=hidden,
        num_hidden_layers=layers,
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
    c, opts, hidden, layers = _shape(ir)
    conf = GatedDeltaNetConfig(
        hidden_size=c.dim,
        num_hidden_layers=layers,
        num_heads=opts["heads"],
        head_dim=opts["head_dim"],
        expand_v=opts["expand_v"],
        vocab_size=c.vocab,
        intermediate_size=hidden,
        tie_word_embeddings=c.tie_embeddings,
        fuse_cross_entropy=True,
    )
    return GatedDeltaNetForCausalLM(conf)


def _shape(ir):
    """(model settings, the first mixer's options, the MLP width, block applications) of `ir`."""
    from lt2dsl.passes.resolve import blocks

    placed = blocks(ir.body)
    first = placed[0][0]
    return ir.config, first.mixers[0].opts, first.mlp.hidden, sum(it for _, it in placed)


def measure_peer(model, cfg: dict, a, steps: int) -> dict:
    """A Hugging Face-style model (`model(input_ids, labels=...)` returns `.loss`) in the plain loop,
    gradient checkpointing where the trainer checkpoints."""
    device = torch.device(cfg["training"]["device"])
    model = model.to(device)
    if cfg["training"]["activation_checkpoint"] != "none":
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    T, rows = cfg["data"]["seq_len"], cfg["training"]["batch_size"]
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (rows, T), generator=g).to(device) for _ in range(2)]

    def step(ids):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not a.smoke):
            model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    free_memory()
    try:
        s = bare_loop(step, batches, steps, warm=2)
    except torch.OutOfMemoryError:
        return {"tok_s": None, "note": "OOM"}
    except RuntimeError as e:  # a peer refusing this card/Triton pair is a row's note, not the end of the run
        return {"tok_s": None, "note": f"error: {str(e).splitlines()[0][:160]}"}
    finally:
        model.to("cpu")  # whatever happened, free the card for the next row
    return {"tok_s": rows * T / s, "step_s": s, "steps": steps, "peak_gib": peak_gib()}
