"""The chunked cross-entropy equals `F.cross_entropy` over the full logits, value and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lt2dsl.train.loss import label_hits, linear_cross_entropy


def inputs(n: int = 37, d: int = 16, v: int = 50):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(v, d, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, v, (n,), generator=g)
    y[[3, 10, n - 1]] = -100
    return h, w, y


@pytest.mark.parametrize("chunk", [1, 8, 37, 100])
def test_matches_full_logits_value_and_gradients(chunk):
    h, w, y = inputs()
    loss = linear_cross_entropy(h, w, y, chunk=chunk)
    ref = F.cross_entropy(h @ w.t(), y, ignore_index=-100, reduction="sum")
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(2.5 * loss, [h, w])
    want = torch.autograd.grad(2.5 * ref, [h, w])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [8, 100])
def test_bf16_products_stay_within_bf16_rounding_of_float64(chunk):
    """With `dtype=bf16` both gradient products run in bf16 (fp32 sums over chunks): each
    gradient is within bf16 rounding of the float64 truth, by relative norm."""
    h64, w64, y = inputs(n=64, d=32, v=80)
    h = h64.detach().float().requires_grad_()
    w = w64.detach().float().requires_grad_()
    loss = linear_cross_entropy(h, w, y, chunk=chunk, dtype=torch.bfloat16)
    ref = F.cross_entropy(h64 @ w64.t(), y, ignore_index=-100, reduction="sum")
    assert abs(loss.item() - ref.item()) / abs(ref.item()) < 2e-2
    got = torch.autograd.grad(loss, [h, w])
    want = torch.autograd.grad(ref, [h64, w64])
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and torch.isfinite(a).all()
        assert ((a.double() - b).norm() / b.norm()).item() < 2e-2


def test_no_grad_and_shapes():
    h, w, y = inputs()
    with torch.no_grad():
        loss = linear_cross_entropy(h.reshape(1, 37, 16), w, y.reshape(1, 37), chunk=5)
    ref = F.cross_entropy(h @ w.t(), y, ignore_index=-100, reduction="sum")
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="disagree"):
        linear_cross_entropy(h, w, y[:-1])


def test_masked_labels_give_no_gradient():
    h, w, y = inputs()
    grad_h, _ = torch.autograd.grad(linear_cross_entropy(h, w, y, chunk=4), [h, w])
    assert grad_h[[3, 10, 36]].abs().max() == 0 and grad_h[0].abs().max() > 0


@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_label_hits_counts_right_argmax_at_labelled_tokens(chunk):
    h, w, y = inputs()
    pred = (h @ w.t()).argmax(-1)
    y[:10] = pred[:10]  # some right answers besides the random labels
    y[4] = -100
    want = int(((pred == y) & (y != -100)).sum())
    assert want >= 9 and label_hits(h.detach().reshape(1, 37, 16), w, y.reshape(1, 37), chunk).item() == want
    assert label_hits(h, w, torch.full_like(y, -100), chunk).item() == 0
