"""`lt2dsl/engine/sampling.py`: the filters exactly, the draws by their frequencies."""

from __future__ import annotations

import math

import torch

from lt2dsl.engine.sampling import Sampling, outside_nucleus, sample

PROBS = [0.5, 0.3, 0.15, 0.05]


def logits(rows: int) -> torch.Tensor:
    """`[rows, 4]` logits of PROBS, in a shuffled token order (2, 0, 3, 1)."""
    order = [2, 0, 3, 1]
    x = torch.tensor([math.log(PROBS[order.index(j)]) for j in range(4)])
    return x.expand(rows, 4).clone()


def test_nucleus_is_the_smallest_set_reaching_p():
    x = logits(1)
    assert outside_nucleus(x, 0.5).tolist() == [[True, True, False, True]]  # token 2 alone: 0.5
    assert outside_nucleus(x, 0.7).tolist() == [[False, True, False, True]]  # 2 and 0: 0.8
    assert outside_nucleus(x, 0.96).tolist() == [[False, False, False, False]]  # all four: 1.0
    assert outside_nucleus(x, 1e-6).tolist() == [[True, True, False, True]]  # the top token stays


def test_draws_follow_softmax_and_the_filters():
    rows = 20000
    g = torch.Generator().manual_seed(0)
    seen = torch.bincount(sample(logits(rows), Sampling(1.0), g), minlength=4) / rows
    want = torch.tensor([PROBS[1], PROBS[3], PROBS[0], PROBS[2]])
    assert torch.allclose(seen, want, atol=0.015), seen
    top2 = torch.bincount(sample(logits(rows), Sampling(1.0, top_k=2), g), minlength=4) / rows
    assert top2[1] == 0 and top2[3] == 0 and abs(top2[2] - 0.5 / 0.8) < 0.015
    nucleus = torch.bincount(sample(logits(rows), Sampling(1.0, top_p=0.7), g), minlength=4) / rows
    assert nucleus[1] == 0 and nucleus[3] == 0 and abs(nucleus[0] - 0.3 / 0.8) < 0.015
    hot = torch.bincount(sample(logits(rows), Sampling(0.25), g), minlength=4) / rows
    sharp = torch.tensor(PROBS) ** 4  # temperature 1/4: p^4, renormalised
    assert abs(hot[2] - sharp[0] / sharp.sum()) < 0.015


def test_greedy_and_seeded_draws():
    x = torch.randn(8, 50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sample(x, Sampling(0.0), None), x.argmax(-1))
    assert torch.equal(sample(x, Sampling(2.0, top_k=1), None), x.argmax(-1))
    a = sample(x, Sampling(1.0), torch.Generator().manual_seed(7))
    assert torch.equal(a, sample(x, Sampling(1.0), torch.Generator().manual_seed(7)))
