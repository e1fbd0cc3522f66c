"""The cross-entropy kernel (`kernels.xent`) against float64 PyTorch: the summed loss and softmax −
one-hot over rows whose width is no multiple of the kernel's block, ignored rows (loss 0, gradient
0), logits of large magnitude, fp32 / bf16 / fp16; the gradient written over the logits; and the
chunked LM loss with the kernel equal to it with PyTorch. NaN never passes (`rel_rms`)."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.xent import IGNORE, xent, xent_reference, xent_triton
from lt2dsl.train.loss import linear_cross_entropy
from tests.kernels.utils import DEVICE, assert_close


def rows(n: int, V: int, scale: float = 3.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, V, generator=g, dtype=torch.float64) * scale
    labels = torch.randint(0, V, (n,), generator=g)
    labels[[0, n // 2]] = IGNORE
    return logits, labels


@pytest.mark.parametrize(
    "n, V, scale, dtype, tol",
    [
        (37, 1000, 3.0, torch.float32, 1e-6),
        (5, 129, 3.0, torch.float32, 1e-6),  # two blocks and one column
        (9, 300, 300.0, torch.float32, 1e-6),  # far from 0: exp overflows unless max-shifted
        (37, 1000, 3.0, torch.bfloat16, 1e-2),
        (8, 257, 3.0, torch.float16, 2e-3),
    ],
)
def test_loss_and_gradient_equal_float64(n, V, scale, dtype, tol):
    x64, y = rows(n, V, scale)
    x = x64.to(DEVICE, dtype)
    # the truth of the rounded inputs: at |x| ~ 300 the fp32 rounding alone moves exp by 2e-5
    want_loss, want_g = xent_reference(x.double().cpu(), y, True)
    loss, g = xent_triton(x.clone(), y.to(DEVICE), True)
    assert loss.dtype == torch.float32 and g.dtype == dtype
    assert abs(loss.item() - want_loss.item()) <= 1e-6 * abs(want_loss.item())  # fp32 of rounded inputs
    assert_close("dlogits", g, want_g, tol)
    assert g[[0, n // 2]].eq(0).all()  # ignored rows
    none_loss, none_g = xent_triton(x.clone(), y.to(DEVICE), False)
    assert none_g is None and none_loss.item() == pytest.approx(loss.item(), rel=1e-6)


def test_the_gradient_is_written_over_the_logits():
    x64, y = rows(6, 200)
    x = x64.to(DEVICE, torch.float32)
    loss, g = xent_triton(x, y.to(DEVICE), True)
    assert g.data_ptr() == x.data_ptr()
    _, g2 = xent_triton(x64.to(DEVICE, torch.float32), y.to(DEVICE), True, in_place=False)
    assert torch.equal(g, g2)


def test_all_rows_ignored_and_no_rows():
    x64, y = rows(4, 50)
    y[:] = IGNORE
    loss, g = xent_triton(x64.to(DEVICE, torch.float32), y.to(DEVICE), True)
    assert loss.item() == 0.0 and g.eq(0).all()
    empty = torch.empty(0, 50, device=DEVICE)
    loss, g = xent_triton(empty, torch.empty(0, dtype=torch.long, device=DEVICE), True)
    assert loss.item() == 0.0 and g.shape == (0, 50)


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match=r"logits \[n, V\] and labels \[n\] expected"):
        xent_triton(torch.zeros(3, 4, device=DEVICE), torch.zeros(2, dtype=torch.long, device=DEVICE), True)
    with pytest.raises(ValueError, match="backend"):
        xent(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long), True, backend="cuda")


@pytest.mark.parametrize("chunk", [7, 64])
def test_chunked_loss_with_the_kernel_equals_it_with_pytorch(chunk):
    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 19, 16, generator=g).to(DEVICE).requires_grad_()
    w = torch.randn(300, 16, generator=g).to(DEVICE).requires_grad_()
    y = torch.randint(0, 300, (2, 19), generator=g).to(DEVICE)
    y[0, :3] = IGNORE
    got = linear_cross_entropy(h, w, y, chunk=chunk, backend="triton")
    want = linear_cross_entropy(h, w, y, chunk=chunk, backend="reference")
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    ga = torch.autograd.grad(got, [h, w])
    gb = torch.autograd.grad(want, [h, w])
    for name, a, b in zip(("dh", "dw"), ga, gb):
        assert_close(name, a, b, 1e-6)
