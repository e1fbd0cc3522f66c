"""RetNet's xPos rotation of q and k in one launch (`lt2dsl.kernels.fused.xpos`): Triton (CPU
interpreter here) against the float64 reference (`naive.xpos_ref`) on irregular shapes (head dims
with an odd number of pairs, B > 1, positions shared by the rows or per row, strided inputs); a
decode step's rotation through `engine.positions.Positions` against the layer's `xpos_at`; calls
autograd must record, and float64, take the reference."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.engine.positions import Positions
from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.kernels.fused.testing import TOL, assert_close
from lt2dsl.lowering.functional_recurrent import xpos_angles, xpos_at

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
P = 700  # table rows

CASES = {
    # (B, T, H0, H1 (None: one tensor), D, positions per row)
    "B2-T5-q3-k1-D18-shared": (2, 5, 3, 1, 18, False),
    "B3-T1-q5-k2-D10-per-row": (3, 1, 5, 2, 10, True),
    "B2-T4-q2-k3-D6-per-row": (2, 4, 2, 3, 6, True),
    "B1-T7-q4-D34-alone": (1, 7, 4, None, 34, False),
}


def _heads(B: int, T: int, H: int, D: int, g: torch.Generator, dtype) -> torch.Tensor:
    """`[B, T, H, D]` as heads of a column slice of a wider projection output."""
    wide = torch.randn(B, T, H * D + 7, generator=g).to(device=DEVICE, dtype=dtype)
    return wide[..., 3 : 3 + H * D].unflatten(-1, (H, D))


def _tables(D: int, dt=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return xpos_angles(D, torch.arange(P, device=DEVICE), dt)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_xpos_matches_float64_reference(case, dtype):
    B, T, H0, H1, D, per_row = case
    g = torch.Generator().manual_seed(0)
    xs = [_heads(B, T, H, D, g, dtype) for H in (H0, H1) if H is not None]
    cos, sin = _tables(D)
    shape = (B, T) if per_row else (T,)
    positions = torch.randint(0, P, shape, generator=g).to(DEVICE)
    with torch.no_grad():
        got = fused.xpos(xs, cos, sin, positions, backend="triton")
    assert len(got) == len(xs)
    for i, (x, y) in enumerate(zip(xs, got)):
        # the fp32 tables are the op's inputs: the reference turns by the same (rounded) angles
        want = naive.xpos_ref(x.double(), cos.double(), sin.double(), positions)
        assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
        assert_close(f"x{i}", y, want, TOL[dtype])


def test_xpos_writes_no_nan_into_padded_channels():
    """A head dim far from a power of two (padded tile) and positions at the table's ends."""
    g = torch.Generator().manual_seed(1)
    x = _heads(2, 2, 3, 42, g, torch.float32)
    cos, sin = _tables(42)
    positions = torch.tensor([[0, P - 1], [P - 1, 0]], device=DEVICE)
    (y,) = fused.xpos([x], cos, sin, positions, backend="triton")
    assert torch.isfinite(y).all()
    assert_close(
        "y", y, naive.xpos_ref(x.double(), cos.double(), sin.double(), positions), TOL[torch.float32]
    )


@pytest.mark.parametrize("T", [1, 3])
def test_decode_rotation_equals_the_layer_rotation(T):
    """`Positions.xpos` (the engine's decode step, one launch for q and k) against `xpos_at`, the
    rotation of every other call, at each row's own positions."""
    g = torch.Generator().manual_seed(2)
    q, k = _heads(3, T, 2, 14, g, torch.float32), _heads(3, T, 1, 14, g, torch.float32)
    t = torch.tensor([0, 17, 250], device=DEVICE)
    with torch.no_grad():
        yq, yk = Positions(t, 300).xpos((q, k), "triton")
    at = t[:, None] + torch.arange(T, device=DEVICE)
    assert_close("q", yq, xpos_at(q.double(), at), TOL[torch.float32])
    assert_close("k", yk, xpos_at(k.double(), at), TOL[torch.float32])
    torch.testing.assert_close(yq, xpos_at(q, at), rtol=1e-5, atol=1e-5)


def test_table_rows_are_the_angles_at_their_positions():
    at = torch.tensor([0, 1, 5, 123, 699])
    for dt in (torch.float32, torch.float64):
        cos, sin = xpos_angles(22, torch.arange(P), dt)
        c, s = xpos_angles(22, at, dt)
        torch.testing.assert_close(cos[at], c, rtol=0, atol=0)
        torch.testing.assert_close(sin[at], s, rtol=0, atol=0)


def test_autograd_and_float64_take_the_reference():
    g = torch.Generator().manual_seed(3)
    x = _heads(2, 3, 2, 10, g, torch.float32).detach().requires_grad_(True)
    cos, sin = _tables(10)
    positions = torch.arange(3, device=DEVICE)
    (y,) = fused.xpos([x], cos, sin, positions, backend="triton")
    assert y.grad_fn is not None
    c64, s64 = _tables(10, torch.float64)
    (y64,) = fused.xpos([x.detach().double()], c64, s64, positions, backend="triton")
    assert y64.dtype == torch.float64
