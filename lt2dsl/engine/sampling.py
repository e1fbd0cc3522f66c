"""Next-token sampling on the device: greedy, temperature, top-k and top-p, no host sync.

`sample(logits, sampling, generator)` draws with the exponential trick (argmax of p / E with
E ~ Exp(1), a sample from p without `torch.multinomial`'s host sync), from a generator the engine
owns and seeds per call, so a captured step replays the same draws for the same seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen (hashable: one captured step per setting).

    Args:
        temperature (float): 0 takes the argmax (greedy); otherwise softmax(logits / temperature).
        top_k (int, Optional): keep the k most likely tokens. Default: `None` (all).
        top_p (float, Optional): keep the smallest set of most likely tokens whose probability
            reaches p (nucleus sampling), in (0, 1]. Default: `None` (all).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def check_sampling(temperature, top_k, top_p) -> Sampling:
    """The `Sampling` of generate's arguments; ValueError naming what was expected otherwise."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")
        top_p = float(top_p)
    return Sampling(float(temperature), top_k, top_p)


def sample(logits: torch.Tensor, s: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """Next tokens `[B]` (int64) from last-position logits `[B, vocab]`."""
    if s.greedy:
        return logits.argmax(dim=-1)
    x = logits.float() / s.temperature
    if s.top_k is not None and s.top_k < x.shape[-1]:
        kth = torch.topk(x, s.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if s.top_p is not None and s.top_p < 1:
        x = x.masked_fill(outside_nucleus(x, s.top_p), float("-inf"))
    probs = torch.softmax(x, dim=-1)
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(dim=-1)


def outside_nucleus(x: torch.Tensor, p: float) -> torch.Tensor:
    """`[B, vocab]` True for tokens outside the top-p nucleus of softmax(x): those whose more likely
    tokens already hold p of the mass (the most likely token always stays)."""
    ordered, order = torch.sort(x, dim=-1, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    drop = (probs.cumsum(dim=-1) - probs) >= p
    return drop.scatter(-1, order, drop)
