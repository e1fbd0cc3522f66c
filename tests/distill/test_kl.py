"""`linear_kd_loss`: the chunked KL + cross-entropy against the dense formula, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lt2dsl.distill.kl import linear_kd_loss
from lt2dsl.train.loss import linear_cross_entropy

N, D, DT, V = 37, 8, 6, 50


def inputs():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, D, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn(V, D, dtype=torch.float64, generator=g).requires_grad_()
    th, tw = (
        torch.randn(N, DT, dtype=torch.float64, generator=g),
        torch.randn(V, DT, dtype=torch.float64, generator=g),
    )
    y = torch.randint(0, V, (N,), generator=g)
    y[[3, 10, 36]] = -100
    return h, w, th, tw, y


def dense(h, w, th, tw, y, kl_w, ce_w, tau):
    s, t, m = h @ w.t(), th @ tw.t(), y != -100
    kl = F.kl_div(F.log_softmax(s / tau, -1), F.log_softmax(t / tau, -1), log_target=True, reduction="none")
    return kl_w * tau**2 * kl.sum(-1)[m].sum() + ce_w * F.cross_entropy(
        s, y, ignore_index=-100, reduction="sum"
    )


@pytest.mark.parametrize(("kl_w", "ce_w", "tau"), [(1.0, 0.0, 1.0), (0.0, 1.0, 1.0), (0.7, 0.3, 2.0)])
def test_chunked_loss_and_gradients_equal_the_dense_formula(kl_w, ce_w, tau):
    h, w, th, tw, y = inputs()
    got = linear_kd_loss(h, w, th, tw, y, kl_weight=kl_w, ce_weight=ce_w, temperature=tau, chunk=5)
    want = dense(h, w, th, tw, y, kl_w, ce_w, tau)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, r in zip(torch.autograd.grad(got, (h, w)), torch.autograd.grad(want, (h, w))):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_no_gradient_path_chunk_size_and_unlabelled_tokens():
    h, w, th, tw, y = inputs()
    with torch.no_grad():
        a, b = linear_kd_loss(h, w, th, tw, y, chunk=7), linear_kd_loss(h, w, th, tw, y, chunk=100)
        ce = linear_kd_loss(h, w, th, tw, y, kl_weight=0.0)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ce, linear_cross_entropy(h, w, y), rtol=1e-12, atol=1e-12)
    loss = linear_kd_loss(h, w, th, tw, y, chunk=4)
    (gh,) = torch.autograd.grad(loss, h)
    assert gh[[3, 10, 36]].abs().max() == 0 and gh[0].abs().max() > 0


def test_a_student_equal_to_its_teacher_has_no_kl():
    h, w, _, _, y = inputs()
    with torch.no_grad():
        assert float(linear_kd_loss(h, w, h, w, y, ce_weight=0.0)) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="vocab"):
        linear_kd_loss(h, w, h, w[:10], y)
