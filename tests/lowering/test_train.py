"""A small looped hybrid learns a synthetic copy task on the CPU (issue 3, "Done when").

`loop T=2 < gdn; swa(window=64) >` at dim 128 sees `x_1 … x_n SEP x_1 … x_n` and is trained to
predict the second half. Chance is log(14) ≈ 2.64 nats per token; the loss must fall well below
it within a short run, through the traced graph, the reference kernels and their backward.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .util import lower

VOCAB, N = 16, 8  # tokens 2..15 are content, 1 is the separator


def copy_batch(B: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randint(2, VOCAB, (B, N), generator=gen)
    return torch.cat([x, torch.ones(B, 1, dtype=torch.long), x], dim=1)  # [B, 2N + 1]


def test_looped_hybrid_learns_to_copy():
    model = lower(
        "loop T=2 < gdn(heads=2, head_dim=32, expand_v=1); swa(window=64) >",
        dtype=torch.float32,
        dim=128,
        vocab=VOCAB,
        heads=4,
        head_dim=32,
        mlp="swiglu(hidden=256)",
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(120):
        ids = copy_batch(16, gen)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits[:, N:].reshape(-1, VOCAB), ids[:, N + 1 :].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    chance = math.log(VOCAB - 2)
    assert losses[0] > 0.8 * chance  # starts near chance: nothing leaks the answer
    assert sum(losses[-10:]) / 10 < 0.1 * chance, losses[-10:]
    # Every parameter group that should learn got a gradient through the loop.
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
