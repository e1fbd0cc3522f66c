"""A sandwich block's residual add (`lt2dsl.kernels.fused.norm_add_rmsnorm`): the branch norm, the
add and the next norm in one kernel (inference), Triton (CPU interpreter here) against the float64
reference on irregular widths; calls autograd must record take the unfused ops."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.kernels.fused.testing import TOL, assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {"B2-T3-D40": (2, 3, 40, 1e-6, 1e-5), "B1-T7-D100-eps-none": (1, 7, 100, None, None)}


def _inputs(B: int, T: int, D: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(B, T, D, generator=g), 3.0 * torch.randn(B, T, D, generator=g)
    w1, w2 = 1.0 + 0.5 * torch.randn(D, generator=g), 1.0 + 0.5 * torch.randn(D, generator=g)
    return x, y, w1, w2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_norm_add_rmsnorm_matches_float64_reference(case, dtype):
    B, T, D, eps1, eps2 = case
    x, y, w1, w2 = (t.to(device=DEVICE, dtype=dtype) for t in _inputs(B, T, D, 0))
    with torch.no_grad():
        n, s = fused.norm_add_rmsnorm(x, y, w1, eps1, w2, eps2, backend="triton")
    finfo = torch.finfo(dtype).eps  # the eps a norm without one uses
    e1, e2 = finfo if eps1 is None else eps1, finfo if eps2 is None else eps2
    want_n, want_s = naive.norm_add_rmsnorm_ref(*(t.double() for t in (x, y, w1)), e1, w2.double(), e2)
    assert n.dtype == s.dtype == dtype
    assert_close("sum", s, want_s, TOL[dtype])
    assert_close("normed", n, want_n, TOL[dtype])


def test_autograd_calls_take_the_unfused_ops():
    x, y, w1, w2 = (t.to(DEVICE).requires_grad_() for t in _inputs(2, 3, 24, 1))
    n, s = fused.norm_add_rmsnorm(x, y, w1, 1e-6, w2, 1e-6, backend="triton")
    got = torch.autograd.grad((n.square() + s).sum(), (x, y, w1, w2))
    leaves = [t.detach().double().requires_grad_() for t in (x, y, w1, w2)]
    rn, rs = naive.norm_add_rmsnorm_ref(leaves[0], leaves[1], leaves[2], 1e-6, leaves[3], 1e-6)
    want = torch.autograd.grad((rn.square() + rs).sum(), leaves)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(f"grad{i}", a, b, TOL[torch.float32])
