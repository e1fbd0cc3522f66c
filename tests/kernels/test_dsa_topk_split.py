"""DSA's decode selects against the one-program select and the reference top-k (`topk_select` over
the keys' unsigned values): the sliced radix select (`select_topk_split`), the row by bisection in
registers (`select_topk_rows`) and slices by bisection then merged (`select_topk_merge`). The same
indices in the same order (index order, −1 pads last), on rows shorter than, equal to and just past
k, ties that straddle slices, slices of uneven length, and scratch buffers full of junk (the kernels
read only what they wrote); which path `select_topk` takes, by shape."""

from __future__ import annotations

import pytest
import torch
import triton

from lt2dsl.kernels.common.attn_utils import topk_select
from lt2dsl.kernels.dsa import triton_topk
from lt2dsl.kernels.dsa.triton_topk import (
    _select_single,
    merge_scratch,
    select_topk_merge,
    select_topk_rows,
    select_topk_split,
    split_scratch,
    split_slices,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
JUNK = 0x5A5A5A5A


def _keys(spread: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """int32 storage of unsigned keys: over the whole range, sharing their top 22 bits, or drawn
    from 5 values, unevenly (long runs of equal keys)."""
    g = torch.Generator().manual_seed(seed)
    if spread == "wide":
        u = torch.randint(0, 2**32, shape, generator=g, dtype=torch.int64)
    elif spread == "narrow":
        u = 0x9ABCD000 + torch.randint(0, 2**10, shape, generator=g, dtype=torch.int64)
    else:
        # the two largest values a tenth of the keys: the threshold of a long row is 2^31 + 255, its
        # low digit 255, with keys above it both inside and outside its top 24 bits
        values = torch.tensor([0] * 10 + [5] * 4 + [2**31 + 255] * 4 + [2**31 + 256, 2**32 - 1])
        u = values[torch.randint(0, 20, shape, generator=g)]
    return torch.where(u >= 2**31, u - 2**32, u).to(torch.int32).to(DEVICE)


def _expected(keys: torch.Tensor, n: torch.Tensor, topk: int) -> torch.Tensor:
    """`[B, C, topk]`: per row, the top-k of keys[:n] (ties: the lower index) in index order, −1 pads."""
    scores = (keys.to(torch.int64) & 0xFFFFFFFF).double()
    valid = torch.arange(keys.shape[-1], device=keys.device) < n[..., None]
    idx = topk_select(scores, valid, topk)
    last = torch.where(idx < 0, 2**40, idx).sort(-1).values
    return last.masked_fill(last == 2**40, -1)


def _junk_scratch(rows: int, KW: int, slice_len: int) -> torch.Tensor:
    S = split_slices(KW, rows, slice_len)[1]
    return split_scratch(rows, S, torch.empty(0, device=DEVICE)).fill_(JUNK)


@pytest.mark.parametrize(
    "spread,slice_len,topk",
    [("ties", 24, 40), ("ties", 100, 40), ("ties", 512, 40), ("ties", 24, 1), ("wide", 24, 40),
     ("narrow", 100, 40), ("narrow", 13, 2)],
)  # fmt: skip
def test_split_at_positions_equals_single_and_reference(spread, slice_len, topk):
    """Decode: one query per row at positions[b] over a static buffer of KW = 301 slots (the slots
    past a row's position are not candidates; the kernels write every slot of out, pads included)."""
    KW = 301
    positions = torch.tensor([0, topk // 2, topk - 1, topk, KW - 1, 150], device=DEVICE)
    B = positions.numel()
    keys = _keys(spread, (B, 1, KW), seed=slice_len + topk)
    single = torch.full((B, 1, topk), 7, dtype=torch.long, device=DEVICE)
    split = single.clone()
    _select_single(keys, single, 0, KW, topk, positions)
    select_topk_split(keys, split, 0, KW, topk, positions, slice_len=slice_len,
                      scratch=_junk_scratch(B, KW, slice_len))  # fmt: skip
    assert torch.equal(split, single)
    assert torch.equal(split, _expected(keys, positions[:, None] + 1, topk))


@pytest.mark.parametrize("spread", ["ties", "wide"])
def test_split_causal_chunk_equals_single_and_reference(spread):
    """A causal chunk of rows at t0 … t0 + C − 1 (n = t + 1: below, at and past k), out pre-filled."""
    B, C, Tq, t0, topk, slice_len = 2, 5, 60, 30, 33, 7
    KW = t0 + C
    keys = _keys(spread, (B, C, KW), seed=3)
    single = torch.full((B, Tq, topk), -1, dtype=torch.long, device=DEVICE)
    split = single.clone()
    _select_single(keys, single, t0, Tq, topk, None)
    scratch = _junk_scratch(B * C, KW, slice_len)
    select_topk_split(keys, split, t0, Tq, topk, slice_len=slice_len, scratch=scratch)
    assert torch.equal(split, single)
    n = torch.arange(t0, t0 + C, device=DEVICE).expand(B, C) + 1
    assert torch.equal(split[:, t0 : t0 + C], _expected(keys, n, topk))
    assert torch.equal(split[:, :t0], torch.full_like(split[:, :t0], -1))


@pytest.mark.parametrize("spread", ["ties", "wide", "narrow"])
@pytest.mark.parametrize("topk", [1, 2, 40, 64])
def test_bisection_at_positions_equals_single_and_reference(spread, topk):
    """Decode over a static buffer of KW = 301 slots: the row in registers (an `[R, W]` tile of 512)
    and slices of 13, 64, 100 and 301 keys merged, with junk in the merge's scratch."""
    KW = 301
    positions = torch.tensor([0, topk // 2, topk - 1, topk, KW - 1, 150], device=DEVICE)
    B = positions.numel()
    keys = _keys(spread, (B, 1, KW), seed=7 * topk + len(spread))
    want = _expected(keys, positions[:, None] + 1, topk)
    rows = torch.full((B, 1, topk), 7, dtype=torch.long, device=DEVICE)
    select_topk_rows(keys, rows, 0, KW, topk, positions)
    assert torch.equal(rows, want)
    for slice_len in (13, 64, 100, 301):
        merged = torch.full_like(rows, 7)
        scratch = merge_scratch(B, -(-KW // slice_len), topk, keys).fill_(JUNK)
        select_topk_merge(keys, merged, 0, KW, topk, positions, slice_len=slice_len, scratch=scratch)
        assert torch.equal(merged, want), slice_len


@pytest.mark.parametrize("spread", ["ties", "wide"])
def test_bisection_causal_chunk_equals_reference(spread):
    """A causal chunk of rows (n = t + 1: below, at and past k), out pre-filled with −1 and kept
    before the chunk."""
    B, C, Tq, t0, topk = 2, 5, 60, 30, 33
    KW = t0 + C
    keys = _keys(spread, (B, C, KW), seed=5)
    n = torch.arange(t0, t0 + C, device=DEVICE).expand(B, C) + 1
    for run in (
        lambda out: select_topk_rows(keys, out, t0, Tq, topk),
        lambda out: select_topk_merge(keys, out, t0, Tq, topk, slice_len=7),
    ):
        out = torch.full((B, Tq, topk), -1, dtype=torch.long, device=DEVICE)
        run(out)
        assert torch.equal(out[:, t0 : t0 + C], _expected(keys, n, topk))
        assert torch.equal(out[:, :t0], torch.full_like(out[:, :t0], -1))


@pytest.mark.skipif(DEVICE == "cpu", reason="decode-size rows: the card's tiles and warps")
@pytest.mark.parametrize("KW, topk", [(4160, 512), (4160, 2048), (8224, 512), (8224, 2048), (32800, 512)])
def test_decode_sized_rows_on_the_card(KW, topk):
    """The lengths and top-k of the examples' decode steps, 8 rows at their own positions: every
    path the same as the one-program select (the row in registers where its tile fits)."""
    B = 8
    keys = _keys("wide", (B, 1, KW), seed=KW + topk)
    keys[1, 0, : KW // 3] = keys[1, 0, 0]  # a third of a row tied
    positions = torch.tensor([KW - 1, KW - 1, topk - 1, topk, KW // 2, KW - 7, 5000, 4095], device=DEVICE)
    single = torch.full((B, 1, topk), 7, dtype=torch.long, device=DEVICE)
    _select_single(keys, single, 0, KW, topk, positions)
    assert torch.equal(single, _expected(keys, positions[:, None] + 1, topk))
    runs = [select_topk_merge, select_topk_split]
    if triton.next_power_of_2(KW) <= triton_topk.MAX_TILE_KEYS:
        runs.append(select_topk_rows)
    for run in runs:
        out = torch.full_like(single, 7)
        run(keys, out, 0, KW, topk, positions)
        assert torch.equal(out, single), run.__name__


def test_bisection_tiles_past_the_register_budget_are_refused():
    """A row, a slice or a merge whose tile would pass MAX_TILE_KEYS is a clear error, not a
    kernel that spills kilobytes a thread."""
    out = torch.empty(1, 1, 2048, dtype=torch.long)
    with pytest.raises(ValueError, match="a row of KW keys needs a register tile of 32,768"):
        select_topk_rows(torch.empty(1, 1, 20000, dtype=torch.int32), out, 0, 20000, 2048)
    with pytest.raises(ValueError, match="candidates needs a register tile of 32,768"):
        select_topk_merge(torch.empty(1, 1, 32800, dtype=torch.int32), out, 0, 32800, 2048)
    with pytest.raises(ValueError, match="a slice needs a register tile of 32,768"):
        select_topk_merge(torch.empty(1, 1, 32800, dtype=torch.int32), out, 0, 32800, 2048, slice_len=20000)


def test_select_topk_splits_few_long_rows(monkeypatch):
    """`select_topk` takes the sliced path for at most SPLIT_MAX_ROWS rows of at least SPLIT_MIN_KW
    keys, else one program a row; slices are multiples of 2048 keys (512 in rows of fewer than
    8192), about SPLIT_PROGRAMS programs in all, at most MAX_SLICES a row."""
    calls = []
    monkeypatch.setattr(triton_topk, "select_topk_split", lambda *a: calls.append("split"))
    monkeypatch.setattr(triton_topk, "_select_single", lambda *a: calls.append("single"))
    shapes = [(1, 1, 8192), (8, 1, 131072), (4, 32, 8192), (1, 1, 4096), (129, 1, 8192), (2, 65, 65536)]
    shapes.append((8, 1, 4095))
    for B, C, KW in shapes:
        triton_topk.select_topk(torch.empty(B, C, KW, dtype=torch.int32), torch.empty(B, C, 8), 0, KW, 8)
    assert calls == ["split"] * 4 + ["single"] * 3
    assert split_slices(131072, 1) == (2048, 64) and split_slices(131072, 8) == (4096, 32)
    assert split_slices(4096, 1) == (512, 8) and split_slices(2**20, 1) == (16384, 64)
    assert split_slices(4160, 1) == (512, 9) and split_slices(6144, 8) == (512, 12)
    assert split_slices(301, 6, 24) == (24, 13) and split_slices(8192, 128) == (4096, 2)
