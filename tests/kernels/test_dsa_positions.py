"""DSA's Triton indexer at per-row positions (`dsa_indexer_triton(..., positions=)`: one query per row
over a static key buffer, the engine's decode step), against the reference's top-k over each row's
slots 0 … t_b. Slots past a row's position hold keys that would win: they must not be candidates."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.common.attn_utils import topk_select
from lt2dsl.kernels.dsa import triton_indexer, triton_topk
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


@pytest.fixture
def sliced(monkeypatch):
    """The decode indexer's sliced path (`_indexer_slice_kernel`, then passes 1–3 of the sliced
    select) on short rows: rows of ≥ 32 slots take it, in slices of 16 slots."""
    monkeypatch.setattr(triton_topk, "SPLIT_MIN_KW", 32)
    monkeypatch.setattr(triton_topk, "SHORT_SLICE_KEYS", 16)


@pytest.mark.parametrize("has_w", [True, False], ids=["w", "no-w"])
@pytest.mark.parametrize("topk", [3, 8, 40])
def test_sliced_scoring_is_the_references_set(sliced, topk, has_w):
    """3 index heads (a tile of 16 rows, 13 padding) of 24 dims, integer-valued (ties: the lower
    slot wins), rows before, at and past k; the sliced path runs (keys written, pass 0 skipped by
    the select) and equals the reference, slot by slot in index order."""
    L = 75
    q, k, w, t = _case([0, 5, 40, 74], L, HI=3, DI=24, seed=topk)
    w = w if has_w else None
    calls = []
    real = triton_indexer.select_topk_split
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_indexer, "select_topk_split", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
        got = dsa_indexer_triton(q, k, w, topk=topk, idx_scale=1.0, ordered=False, positions=t, w_scale=0.5)
    assert [c["first_pass"] for c in calls] == [1] and calls[0]["slice_len"] == 16
    wt = torch.ones(4, 1, 3, dtype=q.dtype, device=q.device) if w is None else w * 0.5
    scores = indexer_scores(q.double(), k.double(), wt.double(), 1.0, torch.float64)
    valid = torch.arange(L, device=q.device)[None, None, :] <= t[:, None, None]
    want = topk_select(scores, valid, topk)
    want = torch.where(want < 0, L, want).sort(-1).values
    assert torch.equal(got, torch.where(want == L, -1, want))


def test_sliced_scoring_equals_the_one_program_path(monkeypatch):
    """Real-valued bf16 inputs: the sliced path's selection is the unsliced path's (`_indexer_kernel`
    and one program a row), index for index: the same scores, summed over the heads in order."""
    g = torch.Generator().manual_seed(5)
    B, L, HI, DI = 3, 96, 4, 32
    q = torch.randn(B, 1, HI, DI, generator=g).bfloat16().to(DEVICE)
    k = torch.randn(B, L, DI, generator=g).bfloat16().to(DEVICE)
    w = torch.randn(B, 1, HI, generator=g).bfloat16().to(DEVICE)
    t = torch.tensor([95, 60, 33], device=DEVICE)
    one = dsa_indexer_triton(q, k, w, topk=24, ordered=False, positions=t)
    monkeypatch.setattr(triton_topk, "SPLIT_MIN_KW", 32)
    monkeypatch.setattr(triton_topk, "SHORT_SLICE_KEYS", 16)
    assert triton_topk.use_split(B, L)
    assert torch.equal(dsa_indexer_triton(q, k, w, topk=24, ordered=False, positions=t), one)
