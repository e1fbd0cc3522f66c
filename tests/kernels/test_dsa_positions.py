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


@pytest.mark.parametrize("HI,DI,L,weights", [(4, 64, 300, True), (3, 48, 77, True), (2, 16, 40, False)])
def test_row_scores_are_the_chunk_kernels_keys(HI, DI, L, weights):
    """The decode scoring (`_indexer_row_kernel`: the heads as one dot's columns) writes the chunk
    kernel's 32-bit keys at one query row, up to the dots' rounding (each dot sums its products in
    an order of its own shape): the keys decoded to scores agree to fp32 rounding, every key is
    written, and the padded heads add nothing."""
    import triton

    from lt2dsl.kernels.common.attn_triton import dot_precision, pow2
    from lt2dsl.kernels.dsa import triton_indexer as TI

    g = torch.Generator().manual_seed(L)
    B = 3
    q = torch.randn(B, 1, HI, DI, generator=g).bfloat16().to(DEVICE)
    k = torch.randn(B, L, DI, generator=g).bfloat16().to(DEVICE)
    wide = torch.randn(B, HI + 3, generator=g).bfloat16().to(DEVICE)
    w = wide[:, 1 : 1 + HI] if weights else None
    sw = wide.stride(0) if weights else HI
    got = torch.full((B, 1, L), 7, dtype=torch.int32, device=DEVICE)
    TI._score_rows(q, k, w, got, 0.125, sw, 0.5)
    want = torch.full((B, 1, L), 9, dtype=torch.int32, device=DEVICE)
    BM, BN = (16, 16) if TI.triton_interpreting() else (64, 128)
    TI._indexer_kernel[(1, triton.cdiv(L, BN), B)](
        q, k, q if w is None else w, want, 0, 1, L, 1, L, 0.125, sw, 0.5, HI=HI, DI=DI, BDI=pow2(DI), BM=BM,
        BN=BN, HAS_W=weights, DOT_PREC=dot_precision(q.dtype), U32=True,
        num_warps=1 if TI.triton_interpreting() else 8,
    )  # fmt: skip
    assert not bool((got == 7).any()), "a key was left unwritten"
    a, b = _scores_of(got), _scores_of(want)
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-6 * b.abs().max().item())


def _scores_of(keys: torch.Tensor) -> torch.Tensor:
    """The fp32 scores of the indexer's unsigned 32-bit keys (int32 storage): the key flips every
    bit of a negative score and the sign bit of a positive one."""
    u = keys.cpu().to(torch.int64) & 0xFFFFFFFF
    bits = torch.where(u >= 2**31, u ^ 0x80000000, u ^ 0xFFFFFFFF)
    return bits.to(torch.int32).view(torch.float32)
