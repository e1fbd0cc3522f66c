"""GPU check of `lt2dsl import` at full size: bf16 logits of imported checkpoints within bf16 norms.

For each family, a full-size config of a public checkpoint (random weights: nothing is
downloaded) is saved with `save_pretrained`, imported with `lt2dsl.from_pretrained` in bf16
(`backend="auto"`: the Triton kernels on CUDA) and run on a fixed prompt. The truth is the
original model in fp32 on the same GPU; the bar is the original's own bf16 run: our bf16 error
against the truth (max-abs relative, and KL of the next-token distributions) may exceed the
original's bf16 error by at most `--slack` (2x), and greedy top-1 must agree on >= 99% of positions.

Ouro and the fla families have no `transformers` class; their truth is the independent fp32
forward of `bench/hf_reference.py` over the same weights (fla's own model instead when `fla`
is installed is a later extension).

Usage (GPU; writes JSON to --out and prints a table):
    PYTHONPATH=. python bench/hf_parity.py [--families llama,qwen2,...] [--seq 256] [--out DIR]
    PYTHONPATH=. python bench/hf_parity.py --smoke   # CPU, tiny configs: the code path only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Full-size configs of public checkpoints (their config.json values that matter here).
FULL = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(  # Llama-3.2-1B
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            rope_scaling=dict(
                rope_type="llama3",
                factor=32.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8192,
            ),
            rope_theta=500000.0,
        ),
    ),
    "smollm2": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(  # SmolLM2-360M
            hidden_size=960,
            intermediate_size=2560,
            num_hidden_layers=32,
            num_attention_heads=15,
            num_key_value_heads=5,
            vocab_size=49152,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            rope_theta=100000.0,
        ),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(  # Qwen2.5-0.5B
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
        ),
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(  # Qwen3-0.6B
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(  # gemma-3-1b (text)
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            query_pre_attn_scalar=256,
            vocab_size=262144,
            sliding_window=512,
            max_position_embeddings=32768,
        ),
    ),
}
TINY = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    query_pre_attn_scalar=8,
    vocab_size=64,
    max_position_embeddings=64,
    sliding_window=4,
)


def errors(logits: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """Max-abs relative error, mean KL(truth || logits) of next-token distributions, top-1 agreement."""
    a, t = logits.float(), truth.float()
    kl = F.kl_div(F.log_softmax(a, -1), F.log_softmax(t, -1), log_target=True, reduction="none").sum(-1)
    return {
        "rel": float((a - t).abs().max() / t.abs().max()),
        "kl": float(kl.mean()),
        "top1": float((a.argmax(-1) == t.argmax(-1)).float().mean()),
    }


def verdict(name: str, ours, theirs, truth, slack: float) -> dict:
    """Our bf16 error against the truth within `slack` × the original's bf16 KL, top-1 within 1%."""
    row = {"family": name, "ours": errors(ours, truth), "theirs_bf16": errors(theirs, truth)}
    bar = max(row["theirs_bf16"]["kl"], 1e-6) * slack
    row["ok"] = row["ours"]["kl"] <= bar and row["ours"]["top1"] >= 0.99 * min(
        1.0, row["theirs_bf16"]["top1"]
    )
    return row


def run_family(name: str, args, device: str) -> dict:
    import transformers

    import lt2dsl

    cfg_cls, model_cls, kw = FULL[name]
    kw = kw | TINY if args.smoke else kw
    if name == "gemma3" or "head_dim" in kw:
        kw = {k: v for k, v in kw.items() if name == "gemma3" or k != "query_pre_attn_scalar"}
    cfg = getattr(transformers, cfg_cls)(**kw)
    torch.manual_seed(0)
    ref = getattr(transformers, model_cls)(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, args.seq if not args.smoke else 16), device=device)
    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        ref.save_pretrained(d)
        truth = ref.to(device)(ids).logits
        theirs = ref.to(torch.bfloat16)(ids).logits
        del ref
        ours = lt2dsl.from_pretrained(d, dtype=torch.bfloat16, backend="auto").to(device).eval()(ids)
    return verdict(name, ours, theirs, truth, args.slack)


def run_reference(name: str, args, device: str) -> dict:
    """Ouro-1.4B / an fla GDN hybrid: weights in their layout, truth from `bench/hf_reference.py`."""
    import lt2dsl
    from bench import hf_layouts as lay
    from bench import hf_reference as R

    if name == "ouro":
        cfg = lay.ouro_config() if args.smoke else lay.OURO_1P4B
        shapes = lay.ouro_shapes(cfg)

        def fn(sd, ids):
            return R.ouro_logits(sd, cfg, ids)
    else:
        cfg, shapes = lay.fla_layout("gdn") if args.smoke else lay.full_gdn_layout()

        def fn(sd, ids):
            return R.fla_logits(sd, cfg, ids, "gdn")

    state = lay.random_state(shapes, std=0.02)
    ids = torch.randint(0, cfg["vocab_size"], (1, args.seq if not args.smoke else 16), device=device)
    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        lay.write_checkpoint(Path(d) / name, cfg | {"dtype": "bfloat16"}, state)
        ours = (
            lt2dsl.from_pretrained(Path(d) / name, dtype=torch.bfloat16, backend="auto")
            .to(device)
            .eval()(ids)
        )
        sd = {k: v.to(device) for k, v in state.items()}
        truth = fn(sd, ids)
        theirs = fn({k: v.to(torch.bfloat16) for k, v in sd.items()}, ids)
    return verdict(name, ours, theirs, truth, args.slack)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join([*FULL, "ouro", "gdn"]))
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--slack", type=float, default=2.0)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--smoke", action="store_true", help="tiny configs on the CPU (no claim)")
    args = p.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if not args.smoke and not torch.cuda.is_available():
        print("error: needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    rows = [(run_family if f in FULL else run_reference)(f, args, device) for f in args.families.split(",")]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "hf_parity.json").write_text(json.dumps(rows, indent=2))
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"imported bf16 vs fp32 truth ({'CPU smoke' if args.smoke else torch.cuda.get_device_name()})"
    )
    for col in ("family", "ours rel", "ours KL", "ours top1", "HF bf16 KL", "HF bf16 top1", "ok"):
        table.add_column(col)
    for r in rows:
        o, t = r["ours"], r["theirs_bf16"]
        table.add_row(
            r["family"],
            f"{o['rel']:.2e}",
            f"{o['kl']:.2e}",
            f"{o['top1']:.3f}",
            f"{t['kl']:.2e}",
            f"{t['top1']:.3f}",
            str(r["ok"]),
        )
    Console().print(table)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
