"""Helpers of the import tests: tiny checkpoints on disk and the parity checks."""

from __future__ import annotations

import torch

from bench.hf_layouts import VOCAB

T = 9


def prompt(batch: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, T), generator=g)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def greedy(logits_fn, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy continuation by full re-forwards (no cache): the reference's tokens."""
    for _ in range(n):
        ids = torch.cat([ids, logits_fn(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids
