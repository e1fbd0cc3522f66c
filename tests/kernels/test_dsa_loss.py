"""`dsa_indexer_kl` in one pass (gathered top-k keys, dense key windows, packed rows) against the
per-row float64 reference, forward and backward; messy selections, empty rows, autocast, windows."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.dsa import dsa_indexer, dsa_indexer_kl
from lt2dsl.kernels.dsa import loss as kl_loss
from lt2dsl.kernels.dsa.reference import dsa_indexer_kl_reference
from tests.kernels.test_dsa import make
from tests.kernels.utils import DEVICE, assert_close

SHAPES = {  # B, Tq, Tk, HQ, HKV, D, HI, DI
    "gqa": (2, 13, 13, 4, 2, 8, 3, 5),
    "decode-like": (1, 9, 21, 3, 1, 4, 2, 4),
    "one-query": (2, 1, 7, 2, 2, 4, 1, 3),
}


def inputs(shape, seed=0):
    B, Tq, Tk, HQ, HKV, D, HI, DI = shape
    q, k, _, qi, ki, wi = make(B, Tq, Tk, HQ, HKV, D, HI=HI, DI=DI, seed=seed)
    return q, k, qi, ki, wi


def messy(idx: torch.Tensor, Tk: int) -> torch.Tensor:
    """A selection with what the loss must drop: −1 pads, repeats, future and out-of-range keys."""
    idx = idx.clone()
    Tq = idx.shape[1]
    idx[:, ::3, 0] = -1
    idx[:, 1::4, 1] = idx[:, 1::4, 2]  # a repeat
    idx[:, :, -1] = torch.arange(Tq) + (Tk - Tq) + 1  # one past the query (in range for all but the last)
    idx[:, ::2, -2] = Tk + 3
    return idx


def per_query_and_grads(fn, q, k, qi, ki, wi, **kw):
    """(per-query KL `[B, Tq]`, grads of qi, ki, wi under a random weight per query)."""
    leaves = [t.detach().clone().requires_grad_() for t in (qi, ki, wi) if t is not None]
    w = leaves[2] if wi is not None else None
    per_query = fn(q, k, leaves[0], leaves[1], w, **kw)
    weight = torch.rand(per_query.shape, generator=torch.Generator().manual_seed(3), dtype=per_query.dtype)
    return per_query, torch.autograd.grad((per_query * weight).sum(), leaves)


def assert_same(got, want, tol=1e-10):
    assert_close("kl", got[0], want[0], tol)
    for name, a, b in zip(("dq_idx", "dk_idx", "dw_idx"), got[1], want[1]):
        assert_close(name, a, b, tol)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("chunk", [None, 1, 4])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_one_pass_equals_the_reference(shape, chunk, sparse):
    q, k, qi, ki, wi = inputs(shape)
    idx = messy(dsa_indexer(qi, ki, wi, topk=5), k.shape[1]) if sparse else None
    got = per_query_and_grads(dsa_indexer_kl, q, k, qi, ki, wi, indices=idx, chunk=chunk, reduction="none")
    want = per_query_and_grads(dsa_indexer_kl_reference, q, k, qi, ki, wi, indices=idx)
    assert_same(got, want)
    assert (got[0] >= 0).all() and got[0].sum() > 0  # a query with one key has KL 0


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_without_head_weights(sparse):
    q, k, qi, ki, _ = inputs(SHAPES["gqa"], seed=1)
    idx = dsa_indexer(qi, ki, topk=4) if sparse else None
    got = per_query_and_grads(dsa_indexer_kl, q, k, qi, ki, None, indices=idx, chunk=5, reduction="none")
    want = per_query_and_grads(dsa_indexer_kl_reference, q, k, qi, ki, None, indices=idx)
    assert_same(got, want)


@pytest.mark.parametrize("chunk", [None, 3])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_a_packed_row_is_its_documents(sparse, chunk):
    """One pass over a packed row (local indices, as `dsa` takes them) = every document alone."""
    q, k, qi, ki, wi = inputs((1, 17, 17, 4, 2, 8, 3, 5), seed=2)
    cu = torch.tensor([0, 5, 6, 17], dtype=torch.int32)
    idx = dsa_indexer(qi, ki, wi, topk=4, cu_seqlens=cu) if sparse else None
    got = per_query_and_grads(dsa_indexer_kl, q, k, qi, ki, wi, indices=idx, cu_seqlens=cu, chunk=chunk,
                              reduction="none")  # fmt: skip

    def by_document(q, k, qi, ki, wi, indices=None):
        parts = []
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            sel = None if indices is None else indices[:, a:b]
            parts.append(dsa_indexer_kl_reference(q[:, a:b], k[:, a:b], qi[:, a:b], ki[:, a:b], wi[:, a:b],
                                                  indices=sel))  # fmt: skip
        return torch.cat(parts, dim=1)

    assert_same(got, per_query_and_grads(by_document, q, k, qi, ki, wi, indices=idx))
    whole = dsa_indexer_kl(q, k, qi, ki, wi, indices=None if idx is None else dsa_indexer(qi, ki, wi, topk=4),
                           reduction="none")  # fmt: skip
    assert (got[0][:, 5:] - whole[:, 5:]).abs().max() > 1e-6  # later documents start afresh


def test_an_empty_selection_gives_zero_and_finite_gradients():
    q, k, qi, ki, wi = inputs(SHAPES["gqa"])
    idx = dsa_indexer(qi, ki, wi, topk=3)
    idx[:, 4] = -1
    idx[1, 7] = k.shape[1] + 1
    per_query, grads = per_query_and_grads(dsa_indexer_kl, q, k, qi, ki, wi, indices=idx, reduction="none")
    assert per_query[:, 4].eq(0).all() and per_query[1, 7] == 0 and (per_query[0, 7] > 0)
    assert all(torch.isfinite(g).all() for g in grads)
    assert_same(
        (per_query, grads), per_query_and_grads(dsa_indexer_kl_reference, q, k, qi, ki, wi, indices=idx)
    )


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_autocast_does_not_reach_the_loss(sparse):
    """A forward under bf16 autocast (backward outside it, as the trainer runs) gives the same fp32
    loss and gradients as without autocast."""
    q, k, qi, ki, wi = (t.float() for t in inputs(SHAPES["gqa"]))
    idx = dsa_indexer(qi, ki, wi, topk=5) if sparse else None
    results = []
    for on in (False, True):
        leaves = [t.clone().requires_grad_() for t in (qi, ki, wi)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
            per_query = dsa_indexer_kl(q, k, *leaves, indices=idx, reduction="none")
        results.append([per_query, *torch.autograd.grad(per_query.sum(), leaves)])
    assert results[1][0].dtype == torch.float32
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("Tq,Tk,starts", [(40, 40, [0]), (40, 40, [0, 3, 4, 30, 31, 36]), (10, 25, [0])])
def test_windows_cover_every_row_within_the_budget(monkeypatch, Tq, Tk, starts):
    heads = 2
    monkeypatch.setattr(kl_loss, "BUDGET", 4 * heads * 200)
    monkeypatch.setattr(kl_loss, "SHORT", 4)
    ws = kl_loss.windows(Tq, Tk, starts, heads, None)
    assert [a for a, _, _ in ws] == [0] + [b for _, b, _ in ws[:-1]] and ws[-1][1] == Tq
    doc = [max(s for s in starts if s <= r) for r in range(Tq)]
    for a, b, lo in ws:
        assert lo == doc[a]  # row a's document start: no key a row sees is cut off
        assert b - a == 1 or (b - a) * (b + Tk - Tq - lo) <= 200, (a, b, lo)
        assert all(doc[r] - lo < 4 for r in range(a, b)), (a, b, lo)  # few keys of other documents
    assert len(ws) < Tq // 2
    assert kl_loss.windows(Tq, Tk, starts, heads, 7) == [(a, min(a + 7, Tq), doc[a]) for a in range(0, Tq, 7)]


def test_packed_selection_is_every_document_alone():
    q, k, qi, ki, wi = (t.float() for t in inputs((1, 17, 17, 4, 2, 8, 3, 5), seed=4))
    cu = torch.tensor([0, 5, 6, 17], dtype=torch.int32)
    docs = ((0, 5), (5, 6), (6, 17))
    want = torch.cat([dsa_indexer(qi[:, a:b], ki[:, a:b], wi[:, a:b], topk=4) for a, b in docs], dim=1)
    assert torch.equal(dsa_indexer(qi, ki, wi, topk=4, cu_seqlens=cu), want)
    dev = [t.to(DEVICE) for t in (qi, ki, wi)]
    got = dsa_indexer(*dev, topk=4, cu_seqlens=cu.to(DEVICE), backend="triton", ordered=False)
    assert torch.equal(got.cpu().sort(-1).values, want.sort(-1).values)


def test_bad_arguments_raise():
    q, k, qi, ki, wi = inputs(SHAPES["gqa"])
    with pytest.raises(ValueError, match="one packed row"):
        dsa_indexer_kl(q, k, qi, ki, wi, cu_seqlens=torch.tensor([0, 13]))
    with pytest.raises(ValueError, match="chunk"):
        dsa_indexer_kl(q, k, qi, ki, wi, chunk=0)
    with pytest.raises(ValueError, match="reduction"):
        dsa_indexer_kl(q, k, qi, ki, wi, reduction="avg")
