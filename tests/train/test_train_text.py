"""Issue 37's CPU "done when": a tiny looped GDN + DSA model trains 200 steps on the text shipped
with the tests (public-domain English, `data/README.md`) and its held-out loss falls below the
unigram entropy of that text; the run leaves torchtitan-named metrics, a plot and a checkpoint."""

from __future__ import annotations

import collections
import json
import math

from lt2dsl.train import run

from .helpers import TEXT, config

NAMES = {"loss", "grad_norm", "tps", "tflops", "mfu", "data_loading(%)", "memory/max_reserved(GiB)"}


def unigram_entropy(data: bytes) -> float:
    """Nats per byte of the byte frequencies of `data`."""
    n = len(data)
    return -sum(c / n * math.log(c / n) for c in collections.Counter(data).values())


def test_looped_gdn_dsa_learns_english_below_the_unigram_entropy(tmp_path):
    cfg = config(
        tmp_path,
        "run",
        training={"steps": 200, "batch_size": 4},
        data={"seq_len": 64},
        optimizer={"lr": 3e-3, "weight_decay": 0.0},
        scheduler={"warmup_steps": 10},
        checkpoint={"enable": True, "interval": 100},
        metrics={"log_interval": 50, "eval_interval": 100, "eval_rows": 32, "plot": True},
    )
    cfg["model"]["file"] = str(model_64(tmp_path))
    result = run(cfg)
    entropy = unigram_entropy(TEXT.read_bytes())  # ≈ 3.0 nats
    assert result.losses[1] > entropy  # starts near log(256): nothing leaks the answers
    assert result.evals[200] < entropy - 0.3, (result.evals, entropy)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert set(rows[0]) >= NAMES and [r["step"] for r in rows if "loss" in r] == [50, 100, 150, 200]
    assert [r["step"] for r in rows if "eval/loss" in r] == [100, 200]
    assert (tmp_path / "run" / "metrics.png").stat().st_size > 10_000
    assert result.checkpoint.name == "step-000200"
    estimate = json.loads((tmp_path / "run" / "estimate.json").read_text())
    assert estimate["train_flops_per_token"] > 0 and estimate["memory_bytes"]["total"] > 0


def model_64(tmp_path):
    path = tmp_path / "model64.lt2"
    path.write_text(
        """model tiny_gdn_dsa {
  dim = 64
  vocab = 256
  heads = 2
  head_dim = 32
  mlp = swiglu(hidden=128)
  tie_embeddings = true
  loop T=2 < gdn(expand_v=1); dsa(topk=16, index_heads=2, index_dim=16) >
}
"""
    )
    return path
