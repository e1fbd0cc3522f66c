"""Helpers of the import tests: tiny checkpoints on disk and the parity checks."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lt2dsl.hf.checkpoint import save_safetensors

VOCAB, T = 64, 9


def prompt(batch: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, T), generator=g)


def write_checkpoint(root: Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """A checkpoint folder laid out as HF writes one: config.json + model.safetensors."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    save_safetensors(state, root / "model.safetensors", metadata={"format": "pt"})
    return root


def random_state(
    shapes: dict[str, tuple[int, ...]], seed: int = 0, std: float = 0.3
) -> dict[str, torch.Tensor]:
    """Random fp32 tensors; norm weights around 1 (so a swapped norm changes the output)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, s in shapes.items():
        t = torch.randn(s, generator=g) * std
        out[k] = t + 1 if "norm" in k else t
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def greedy(logits_fn, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy continuation by full re-forwards (no cache): the reference's tokens."""
    for _ in range(n):
        ids = torch.cat([ids, logits_fn(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids
