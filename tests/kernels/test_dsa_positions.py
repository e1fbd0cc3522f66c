"""DSA's Triton indexer at per-row positions (`dsa_indexer_triton(..., positions=)`: one query per row
over a static key buffer, the engine's decode step), against the reference's top-k over each row's
slots 0 … t_b. Slots past a row's position hold keys that would win: they must not be candidates."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.common.attn_utils import topk_select
from lt2dsl.kernels.dsa.reference import indexer_scores
from lt2dsl.kernels.dsa.triton_indexer import dsa_indexer_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(positions: list[int], L: int, HI: int, DI: int, seed: int):
    """Integer-valued q, k, w (scores exact in fp32, ties possible: the lower slot wins both ways);
    slots past each row's position get large keys."""
    g = torch.Generator().manual_seed(seed)
    B = len(positions)
    q = torch.randint(-2, 3, (B, 1, HI, DI), generator=g).float()
    k = torch.randint(-2, 3, (B, L, DI), generator=g).float()
    w = torch.randint(1, 3, (B, 1, HI), generator=g).float()
    t = torch.tensor(positions)
    past = torch.arange(L)[None, :] > t[:, None]
    k = torch.where(past[..., None], q[:, :, 0].sign() * 50.0, k)
    return q.to(DEVICE), k.to(DEVICE), w.to(DEVICE), t.to(DEVICE)


@pytest.mark.parametrize("topk", [3, 8, 40])
def test_selection_at_row_positions_is_the_references_set(topk):
    L = 37
    q, k, w, t = _case([0, 5, 17, 36], L, HI=2, DI=16, seed=topk)
    got = dsa_indexer_triton(q, k, w, topk=topk, idx_scale=1.0, ordered=False, positions=t)
    scores = indexer_scores(q.double(), k.double(), w.double(), 1.0, torch.float64)
    valid = torch.arange(L, device=q.device)[None, None, :] <= t[:, None, None]
    want = topk_select(scores, valid, topk)
    assert got.shape == want.shape == (4, 1, topk)
    assert torch.equal(got.sort(-1).values, want.sort(-1).values)
    assert bool((got <= t[:, None, None]).all()), "a slot past its row's position was selected"


def test_positions_need_one_query_and_a_set():
    q, k, w, t = _case([3, 4], 8, HI=1, DI=8, seed=0)
    with pytest.raises(ValueError, match="Tq = 1"):
        dsa_indexer_triton(q, k, w, topk=2, positions=t)
    with pytest.raises(ValueError, match="Tq = 1"):
        dsa_indexer_triton(q.expand(2, 2, 1, 8), k, w.expand(2, 2, 1), topk=2, ordered=False, positions=t)


def test_weights_read_in_place_and_scaled_in_the_kernel():
    """w as a column slice of a wider projection, scaled by `w_scale` in the kernel with the product
    rounded to w's dtype as `w * w_scale` rounds. Slot 0 scores w₀·1 and slot 1 w₁·3 with w = (3, 1):
    a tie unscaled (or scaled in fp32), while bf16(3/3) = 1 < 3·bf16(1/3): the rounding decides."""
    B, L, DI = 2, 6, 16
    q = torch.zeros(B, 1, 2, DI)
    q[:, :, 0, 0], q[:, :, 1, 1] = 1.0, 1.0
    k = torch.zeros(B, L, DI)
    k[:, 0, 0], k[:, 1, 1] = 1.0, 3.0
    wide = torch.zeros(B, 1, 7)
    wide[..., 2], wide[..., 3] = 3.0, 1.0
    q, k, wide = (x.bfloat16().to(DEVICE) for x in (q, k, wide))
    w = wide[..., 2:4]
    t = torch.tensor([4, 5], device=DEVICE)
    got = dsa_indexer_triton(q, k, w, topk=1, idx_scale=1.0, ordered=False, positions=t, w_scale=1 / 3)
    scaled = w * (1 / 3)  # bf16: (1, 0.33398)
    scores = indexer_scores(q.double(), k.double(), scaled.double(), 1.0, torch.float64)
    valid = torch.arange(L, device=DEVICE)[None, None, :] <= t[:, None, None]
    want = topk_select(scores, valid, 1)
    assert want.flatten().tolist() == [1, 1]
    assert torch.equal(got, want)
