"""Half-split RoPE of q and k in one launch (`lt2dsl.kernels.fused.rope`): Triton (CPU interpreter
here) against the float64 reference on irregular shapes, partial rotation, per-row tables, strided
inputs; calls autograd must record take the reference."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.kernels.fused.testing import TOL, assert_close
from lt2dsl.lowering.functional import rope_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {
    # (B, T, H0, H1 (None: one tensor), D, R, rows of the table: 1 (shared) or B (per row))
    "B2-T5-q3-k1-D24-full": (2, 5, 3, 1, 24, 24, 1),
    "B3-T1-q5-k2-D20-R8-per-row": (3, 1, 5, 2, 20, 8, 3),
    "B1-T7-q4-D32-R16-alone": (1, 7, 4, None, 32, 16, 1),
    "B2-T3-q1-k6-D12-R4": (2, 3, 1, 6, 12, 4, 1),
}


def _table(rows: int, T: int, R: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope_rows` `[rows, T, R]` at random positions, fp32."""
    positions = torch.randint(0, 500, (rows * T,), generator=g)
    c, s = rope_rows(R, 10000.0, positions, torch.float32)
    return c.view(rows, T, R).to(DEVICE), s.view(rows, T, R).to(DEVICE)


def _heads(B: int, T: int, H: int, D: int, g: torch.Generator, dtype) -> torch.Tensor:
    """`[B, T, H, D]` as heads of a column slice of a wider projection output."""
    wide = torch.randn(B, T, H * D + 7, generator=g).to(device=DEVICE, dtype=dtype)
    return wide[..., 3 : 3 + H * D].unflatten(-1, (H, D))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_rope_matches_float64_reference(case, dtype):
    B, T, H0, H1, D, R, rows = case
    g = torch.Generator().manual_seed(0)
    xs = [_heads(B, T, H, D, g, dtype) for H in (H0, H1) if H is not None]
    c, s = _table(rows, T, R, g)
    got = fused.rope(xs, c, s, backend="triton")
    assert len(got) == len(xs)
    for i, (x, y) in enumerate(zip(xs, got)):
        want = naive.rope_ref(x.double(), c.double(), s.double())
        assert y.dtype == dtype and y.shape == x.shape
        assert_close(f"y{i}", y, want, TOL[dtype])
        # the channels past R are copied, not computed
        torch.testing.assert_close(y[..., R:], x[..., R:], rtol=0, atol=0)


def test_reference_is_the_rotation():
    """At position p the first R channels turn pairwise (j, j + R/2) by p·θ_j; the rest stay."""
    D, R, p = 10, 6, 7
    x = torch.randn(1, 1, 2, D, dtype=torch.float64)
    c, s = rope_rows(R, 100.0, torch.tensor([p]), torch.float64)
    y = naive.rope_ref(x, c[None], s[None])
    theta = 100.0 ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    a, b = x[..., : R // 2], x[..., R // 2 : R]
    cos, sin = (p * theta).cos(), (p * theta).sin()
    torch.testing.assert_close(y[..., :R], torch.cat([a * cos - b * sin, b * cos + a * sin], -1))
    torch.testing.assert_close(y[..., R:], x[..., R:], rtol=0, atol=0)


def test_autograd_calls_take_the_reference():
    g = torch.Generator().manual_seed(1)
    x = _heads(2, 4, 3, 16, g, torch.float32).detach().requires_grad_()
    c, s = _table(1, 4, 16, g)
    (y,) = fused.rope([x], c, s, backend="triton")
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(naive.rope_ref(xr, c.double(), s.double()).square().sum(), xr)
    assert_close("grad", gx, gr, TOL[torch.float32])


def test_op_compiles_fullgraph():
    g = torch.Generator().manual_seed(2)
    q, k = _heads(2, 3, 4, 8, g, torch.float32), _heads(2, 3, 2, 8, g, torch.float32)
    c, s = _table(2, 3, 8, g)

    def f(q, k):
        return fused.rope([q, k], c, s, backend="triton")

    eager = f(q, k)
    comp = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k)
    for a, b in zip(comp, eager, strict=True):
        torch.testing.assert_close(a, b)
