"""The fused Triton KL over the selected keys (`dsa_indexer_kl(..., backend="triton")`, `triton_loss`)
against the float64 reference, forward and the gradients of q_idx, k_idx and w_idx: irregular shapes
(selections longer than a slot chunk, k not a power of two, GQA), −1 pads, repeats, future and
out-of-range keys, queries with fewer than k causal keys, packed rows, empty selections, bf16.
Kernel buffers start as NaN (`poison`), and a NaN anywhere fails `assert_close`."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lt2dsl.kernels.dsa import dsa_indexer, dsa_indexer_kl
from lt2dsl.kernels.dsa import loss as kl_loss
from lt2dsl.kernels.dsa.reference import dsa_indexer_kl_reference, to_global
from tests.kernels.test_dsa import make
from tests.kernels.test_dsa_loss import messy
from tests.kernels.utils import DEVICE, assert_close

SHAPES = {  # B, Tq, Tk, HQ, HKV, D, HI, DI, topk: selections of 19 and 21 slots span two chunks of 16
    "gqa3-k19": (2, 21, 21, 6, 2, 8, 3, 5, 19),
    "decode-like-k7": (1, 9, 23, 3, 1, 4, 2, 4, 7),
    "mha-k21": (1, 25, 25, 2, 2, 16, 1, 8, 21),
}


def inputs(shape, seed=0, dtype=torch.float64):
    B, Tq, Tk, HQ, HKV, D, HI, DI, _ = shape
    q, k, _, qi, ki, wi = make(B, Tq, Tk, HQ, HKV, D, HI=HI, DI=DI, seed=seed)
    return [t.to(dtype) for t in (q, k, qi, ki, wi)]


def per_query_and_grads(fn, q, k, qi, ki, wi, **kw):
    """(per-query KL `[B, Tq]`, grads of qi, ki (and wi) under a random weight per query, the same
    weights whatever the dtype)."""
    leaves = [t.detach().clone().to(DEVICE).requires_grad_() for t in (qi, ki, wi) if t is not None]
    w = leaves[2] if wi is not None else None
    kw = {name: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for name, v in kw.items()}
    per_query = fn(q.to(DEVICE), k.to(DEVICE), leaves[0], leaves[1], w, **kw)
    g = torch.Generator().manual_seed(3)
    weight = torch.rand(per_query.shape, generator=g, dtype=torch.float64).to(per_query)
    return per_query, torch.autograd.grad((per_query * weight).sum(), leaves)


def assert_same(got, want, tol):
    assert_close("kl", got[0], want[0], tol)
    assert len(got[1]) == len(want[1])
    for name, a, b in zip(("dq_idx", "dk_idx", "dw_idx"), got[1], want[1]):
        assert_close(name, a, b, tol)


def triton_kl(q, k, qi, ki, wi, **kw):
    return dsa_indexer_kl(q, k, qi, ki, wi, reduction="none", backend="triton", **kw)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_matches_the_reference(shape, poison):
    q, k, qi, ki, wi = inputs(shape)
    idx = messy(dsa_indexer(qi, ki, wi, topk=shape[-1]), k.shape[1])
    want = per_query_and_grads(dsa_indexer_kl_reference, q, k, qi, ki, wi, indices=idx)
    got = per_query_and_grads(triton_kl, *(t.float() for t in (q, k, qi, ki, wi)), indices=idx.to(DEVICE))
    assert_same(got, want, 2e-5)
    assert (got[0] >= 0).all() and (got[0] > 1e-3).sum() > got[0].numel() // 2


def test_without_head_weights_and_a_random_selection(poison):
    """w_idx None (every head weighs 1) and a selection not made by the indexer, in scrambled order
    with repeats: a repeated key counts once wherever it sits."""
    shape = SHAPES["gqa3-k19"]
    q, k, qi, ki, _ = inputs(shape, seed=1)
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(-1, k.shape[1], (*q.shape[:2], 11), generator=g)
    idx[:, :, 7] = idx[:, :, 2]
    want = per_query_and_grads(dsa_indexer_kl_reference, q, k, qi, ki, None, indices=idx)
    got = per_query_and_grads(triton_kl, *(t.float() for t in (q, k, qi, ki)), None, indices=idx.to(DEVICE))
    assert_same(got, want, 2e-5)


def test_a_packed_row_is_its_documents_pads_and_all(poison):
    """Local indices of a packed row (with −1 pads inside) = each document alone; the inputs make both
    the document start and the pads matter: read as positions of the whole row, or with a pad taken
    as key −1 of the document (the previous document's last), the truth differs."""
    shape = (1, 30, 30, 4, 2, 8, 3, 5, 6)
    q, k, qi, ki, wi = inputs(shape, seed=2)
    cu = torch.tensor([0, 7, 8, 19, 30])
    idx = dsa_indexer(qi, ki, wi, topk=6, cu_seqlens=cu)
    idx[:, 11::3, 0] = -1
    docs = list(zip(cu[:-1].tolist(), cu[1:].tolist()))

    def by_document(q, k, qi, ki, wi, indices):
        parts = [dsa_indexer_kl_reference(q[:, a:b], k[:, a:b], qi[:, a:b], ki[:, a:b], wi[:, a:b],
                                          indices=indices[:, a:b]) for a, b in docs]  # fmt: skip
        return torch.cat(parts, dim=1)

    want = per_query_and_grads(by_document, q, k, qi, ki, wi, indices=idx)
    got = per_query_and_grads(triton_kl, *(t.float() for t in (q, k, qi, ki, wi)), indices=idx.to(DEVICE),
                              cu_seqlens=cu.to(DEVICE))  # fmt: skip
    assert_same(got, want, 2e-5)
    whole = dsa_indexer_kl_reference(q, k, qi, ki, wi, indices=idx)
    assert (whole[:, 7:] - want[0].cpu()[:, 7:]).abs().max() > 1e-3
    pads_kept = torch.where(idx == -1, to_global(idx.clamp_min(0), cu) - 1, to_global(idx, cu))
    kept = dsa_indexer_kl_reference(q, k, qi, ki, wi, indices=pads_kept)
    assert (kept[:, 11::3] - want[0].cpu()[:, 11::3]).abs().min() > 1e-4


def test_empty_selections_give_zero_and_finite_gradients(poison):
    """All-pad, all-future and out-of-range selections: KL 0, finite gradients; FLOPs are counted."""
    shape = SHAPES["gqa3-k19"]
    q, k, qi, ki, wi = inputs(shape, seed=3, dtype=torch.float32)
    idx = dsa_indexer(qi, ki, wi, topk=5)
    idx[:, 4] = -1
    idx[1, 7] = k.shape[1] + 1
    idx[0, 9] = 12
    with FlopCounterMode(display=False) as flops:
        got = per_query_and_grads(triton_kl, q, k, qi, ki, wi, indices=idx.to(DEVICE))
    B, Tq, HQ, D = q.shape
    HI, DI = qi.shape[2:]
    assert flops.get_total_flops() == 2 * B * Tq * 5 * (2 * HQ * D + HI * DI) + 6 * B * Tq * 5 * HI * DI
    assert got[0][:, 4].eq(0).all() and got[0][1, 7] == 0 and got[0][0, 9] == 0 and got[0][0, 7] > 0
    truth = [t.double() for t in (q, k, qi, ki, wi)]
    want = per_query_and_grads(dsa_indexer_kl_reference, *truth, indices=idx)
    assert_same(got, want, 2e-5)


def test_bf16_and_mixed_dtypes_stay_close(poison):
    """bf16 main and index projections with fp32 index keys (a norm's output under autocast):
    fp32 loss, gradients in each input's dtype, near the float64 truth of the same values."""
    shape = SHAPES["gqa3-k19"]
    q, k, qi, ki, wi = inputs(shape, seed=4, dtype=torch.bfloat16)
    ki = ki.float()
    idx = messy(dsa_indexer(qi.double(), ki.double(), wi.double(), topk=shape[-1]), k.shape[1])
    got = per_query_and_grads(triton_kl, q, k, qi, ki, wi, indices=idx.to(DEVICE))
    assert got[0].dtype == torch.float32
    assert [g.dtype for g in got[1]] == [torch.bfloat16, torch.float32, torch.bfloat16]
    truth = [t.double() for t in (q, k, qi, ki, wi)]
    want = per_query_and_grads(dsa_indexer_kl_reference, *truth, indices=idx)
    assert_same(got, want, 1.5e-2)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_reductions_and_backends(reduction):
    """ "sum" / "mean" as the reference's; "auto" takes the kernels on CUDA only; float64 refuses them."""
    shape = SHAPES["decode-like-k7"]
    q, k, qi, ki, wi = inputs(shape, seed=6)
    idx = dsa_indexer(qi, ki, wi, topk=7)
    want = dsa_indexer_kl_reference(q, k, qi, ki, wi, indices=idx)
    want = want.sum() if reduction == "sum" else want.mean()
    dev = [t.float().to(DEVICE) for t in (q, k, qi, ki, wi)]
    got = dsa_indexer_kl(*dev, indices=idx.to(DEVICE), reduction=reduction, backend="triton")
    assert got.shape == () and got.dtype == torch.float32
    assert_close("kl", got, want, 2e-6)
    assert kl_loss._fused("auto", dev[0], torch.float32) == (DEVICE == "cuda")
    assert not kl_loss._fused("auto", dev[0], torch.float64)
    with pytest.raises(ValueError, match="float64"):
        dsa_indexer_kl(*(t.to(DEVICE) for t in (q, k, qi, ki, wi)), indices=idx.to(DEVICE), backend="triton")


def test_opcheck():
    """Schema, fake tensors and autograd registration of `lt2dsl::dsa_kl_fwd` (and so of its backward)."""
    from lt2dsl.kernels.dsa import triton_loss  # noqa: F401  (registers the ops)

    q, k, qi, ki, wi = (t.float().to(DEVICE) for t in inputs(SHAPES["decode-like-k7"], seed=7))
    idx = dsa_indexer(qi, ki, wi, topk=7).sort(dim=-1).values
    start = torch.zeros(q.shape[1], dtype=torch.int64, device=DEVICE)
    leaves = [t.requires_grad_() for t in (qi, ki, wi)]
    torch.library.opcheck(torch.ops.lt2dsl.dsa_kl_fwd, (q, k, *leaves, idx, start, 0.5, 0.3))
