"""The sparse-attention forward split over each selection (`sparse_attn_fwd(..., splits=n)`: partials
merged by lse, the decode step's short grids) against a float64 loop over the selected keys: o and
lse, for DSA's shared selections and NSA's per-kv-head ones, GQA, −1 pads, future and out-of-range
keys, rows that select nothing (o 0, lse +inf), splits that select nothing, strided k/v (the cache's
views), bf16; split = unsplit. Kernel buffers start as NaN (`poison`)."""

from __future__ import annotations

import math

import pytest
import torch

from lt2dsl.kernels.dsa import dsa
from lt2dsl.kernels.dsa.triton_attn import sparse_attn_fwd, split_count
from tests.kernels.utils import DEVICE, assert_close, seeded_like


def naive(q, k, v, indices, scale):
    """(o `[B, Tq, HQ, V]`, lse `[HQ, B·Tq]` in log2 units, +inf for an empty selection), float64."""
    B, Tq, HQ, _ = q.shape
    Tk, HKV = k.shape[1:3]
    G = HQ // HKV
    o = torch.zeros(B, Tq, HQ, v.shape[-1], dtype=torch.float64)
    lse = torch.full((HQ, B * Tq), math.inf, dtype=torch.float64)
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    indices = indices.cpu()
    for b in range(B):
        for t in range(Tq):
            pos = t + Tk - Tq
            for h in range(HQ):
                sel = indices[b, t, h // G] if indices.dim() == 4 else indices[b, t]
                keep = sorted({int(j) for j in sel if 0 <= j <= pos and j < Tk})
                if not keep:
                    continue
                s = (k[b, keep, h // G] @ q[b, t, h]) * scale
                p = torch.softmax(s, 0)
                o[b, t, h] = p @ v[b, keep, h // G]
                lse[h, b * Tq + t] = torch.logsumexp(s, 0) / math.log(2)
    return o, lse


def messy_selection(B, Tq, Tk, nidx, heads=None, seed=0):
    """Distinct keys per row in random order with −1 pads, future and out-of-range entries; row 0 of
    batch 0 selects nothing valid."""
    g = torch.Generator().manual_seed(seed)
    shape = (B, Tq) if heads is None else (B, Tq, heads)
    rows = torch.stack([torch.randperm(Tk + 6, generator=g)[:nidx] for _ in range(math.prod(shape))])
    idx = torch.where(rows >= Tk + 3, torch.full_like(rows, -1), rows).view(*shape, nidx)
    idx[0, 0] = -1
    return idx


def inputs(B, Tq, Tk, HQ, HKV, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, Tq, HQ, D), (B, Tk, HKV, D), (B, Tk, HKV, D))
    return [torch.randn(*s, generator=g).to(DEVICE, dtype) for s in shapes]


CASES = {  # B, Tq, Tk, HQ, HKV, D, selection length, per kv head
    "decode-gqa": (2, 1, 70, 4, 2, 16, 45, False),
    "two-queries-mha": (1, 2, 50, 2, 2, 8, 37, False),
    "nsa-per-head": (2, 1, 60, 6, 3, 16, 33, True),
}


@pytest.mark.parametrize("splits", [2, 3, 7])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_split_matches_the_loop_and_the_unsplit_kernel(case, splits, poison):
    B, Tq, Tk, HQ, HKV, D, nidx, per_head = case
    q, k, v = inputs(B, Tq, Tk, HQ, HKV, D)
    idx = messy_selection(B, Tq, Tk, nidx, HKV if per_head else None).to(DEVICE)
    want_o, want_lse = naive(q, k, v, idx, D**-0.5)
    o, lse = sparse_attn_fwd(q, k, v, idx, D**-0.5, splits=splits)
    o1, lse1 = sparse_attn_fwd(q, k, v, idx, D**-0.5, splits=1)
    assert_close("o", o, want_o, 1e-5)
    assert_close("o unsplit", o1, want_o, 1e-5)
    finite = torch.isfinite(want_lse)
    assert (~finite).any() and torch.equal(torch.isinf(lse.cpu()), ~finite)
    assert_close("lse", lse.cpu()[finite], want_lse[finite], 1e-6)
    assert_close("lse unsplit", lse1.cpu()[finite], want_lse[finite], 1e-6)
    assert o[0, 0].eq(0).all()


def test_splits_that_select_nothing_and_more_splits_than_chunks(poison):
    """Every valid key in the first chunk (later splits see only pads), and a split count above
    what the selection allows (rounded down to whole BK chunks)."""
    B, Tq, Tk, HQ, HKV, D = 1, 1, 40, 2, 1, 16
    q, k, v = inputs(B, Tq, Tk, HQ, HKV, D, seed=1)
    idx = torch.full((B, Tq, 48), -1, dtype=torch.long)
    idx[0, 0, :5] = torch.tensor([3, 17, 0, 39, 22])
    idx = idx.to(DEVICE)
    want_o, want_lse = naive(q, k, v, idx, 0.3)
    for splits in (3, 64):
        o, lse = sparse_attn_fwd(q, k, v, idx, 0.3, splits=splits)
        assert_close("o", o, want_o, 1e-5)
        assert_close("lse", lse, want_lse, 1e-6)


def test_strided_cache_views_and_bf16(poison):
    """k, v as head-major views of NaN-filled buffers (the decode cache) in bf16: the split reads
    them in place, as the unsplit kernel does."""
    B, Tq, Tk, HQ, HKV, D = 2, 1, 40, 4, 2, 16
    q, k, v = inputs(B, Tq, Tk, HQ, HKV, D, dtype=torch.bfloat16, seed=2)
    views = []
    for t in (k, v):
        buf = torch.full((B, HKV, 64, D), float("nan"), device=DEVICE, dtype=torch.bfloat16)
        buf[:, :, :Tk] = t.transpose(1, 2)
        views.append(buf[:, :, :Tk].transpose(1, 2))
    idx = messy_selection(B, Tq, Tk, 30, seed=3).to(DEVICE)
    want_o, _ = naive(q, k, v, idx, D**-0.5)
    o, _ = sparse_attn_fwd(q, *views, idx, D**-0.5, splits=4)
    o1, _ = sparse_attn_fwd(q, k, v, idx, D**-0.5, splits=1)
    assert_close("o", o, want_o, 1e-2)
    assert_close("o vs unsplit", o, o1, 1e-2)


def test_gradients_through_a_split_forward(poison):
    """A grid short enough to split (2 queries, one kv head) trains: the backward reads the combined
    lse, so dq, dk, dv equal the float64 reference's."""
    B, Tq, Tk, HQ, HKV, D = 1, 2, 40, 4, 1, 16
    assert split_count(Tq * B * HKV, 24, 16, DEVICE) > 1 or DEVICE != "cpu"
    q, k, v = (t.requires_grad_() for t in inputs(B, Tq, Tk, HQ, HKV, D, seed=4))
    idx = messy_selection(B, Tq, Tk, 24, seed=5).to(DEVICE)
    o = dsa(q, k, v, None, None, topk=24, indices=idx, backend="triton")
    do = seeded_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = dsa(*ref_in, None, None, topk=24, indices=idx)
    ref_grads = torch.autograd.grad(ref, ref_in, do.double())
    assert_close("o", o, ref, 1e-5)
    for name, a, b in zip("qkv", grads, ref_grads):
        assert_close(f"d{name}", a, b, 1e-5)


def test_split_count():
    """One program a selection where the grid is large; the decode step's short grid split, each
    split ≥ 2·BK slots; under the CPU interpreter 2 for small grids, so CI runs the split path."""
    if DEVICE == "cpu":
        assert split_count(4, 40, 16, "cpu") == 2 and split_count(4, 16, 16, "cpu") == 1
        assert split_count(64, 40, 16, "cpu") == 1
        return
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    assert split_count(n_sm, 2048, 64, DEVICE) == 1
    assert split_count(16, 2048, 64, DEVICE) == min(math.ceil(2 * n_sm / 16), 16)
    assert split_count(16, 100, 64, DEVICE) == 1
