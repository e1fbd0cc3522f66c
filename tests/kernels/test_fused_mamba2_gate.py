"""Mamba2's gates in one launch (`lt2dsl.kernels.fused.mamba2_gate`): Triton (CPU interpreter
here) against the float64 reference (`naive.mamba2_gate_ref`) on irregular shapes (odd head
counts and head dims, B > 1, several tokens, x and a as strided column slices of one projection,
softplus past its threshold); calls autograd must record, and float64, take the reference."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.kernels.fused.testing import TOL, assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {
    # (B, T, H, P)
    "B3-T1-H5-P7": (3, 1, 5, 7),
    "B2-T4-H3-P16": (2, 4, 3, 16),
    "B1-T1-H48-P64": (1, 1, 48, 64),
    "B2-T3-H70-P3": (2, 3, 70, 3),
}


def _inputs(B: int, T: int, H: int, P: int, dtype, g: torch.Generator) -> tuple:
    """(a, x, A_log, dt_bias): a and x column slices of one `[B, T, ·]` tensor (as the in
    projection and conv outputs are), A_log and dt_bias in the model's dtype."""

    def r(*s, std=1.0):
        return (torch.randn(*s, generator=g) * std).to(device=DEVICE, dtype=dtype)

    wide = r(B, T, H * P + H + 5, std=2.0)
    x = wide[..., 2 : 2 + H * P].unflatten(-1, (H, P))
    a = wide[..., 2 + H * P : 2 + H * P + H]
    a[..., 0] = 30.0  # softplus above its threshold passes the input through
    A_log = (torch.rand(H, generator=g) * 2.7).to(device=DEVICE, dtype=dtype)  # A in [1, 15]
    dt_bias = r(H)
    return a, x, A_log, dt_bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_mamba2_gate_matches_float64_reference(case, dtype):
    a, x, A_log, dt_bias = _inputs(*case, dtype, torch.Generator().manual_seed(0))
    with torch.no_grad():
        v, g = fused.mamba2_gate(a, x, A_log, dt_bias, backend="triton")
    v_ref, g_ref = naive.mamba2_gate_ref(
        a.double(), x.double(), A_log.double(), dt_bias.double(), torch.float64
    )
    assert v.dtype == dtype and v.shape == x.shape and g.dtype == torch.float32 and g.shape == a.shape
    assert_close("g", g, g_ref, TOL[torch.float32])
    assert_close("v", v, v_ref, TOL[dtype])


def test_decode_gates_equal_the_unfused_ops():
    """The kernel against the fp32 ops of the layer on the same inputs (fp32 rounding apart)."""
    a, x, A_log, dt_bias = _inputs(3, 1, 5, 7, torch.bfloat16, torch.Generator().manual_seed(1))
    with torch.no_grad():
        v, g = fused.mamba2_gate(a, x, A_log, dt_bias, backend="triton")
    v_ref, g_ref = naive.mamba2_gate_ref(a, x, A_log, dt_bias, torch.float32)
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v, v_ref, rtol=8e-3, atol=0)


def test_autograd_and_float64_take_the_reference():
    a, x, A_log, dt_bias = _inputs(2, 1, 3, 4, torch.float32, torch.Generator().manual_seed(2))
    A_log.requires_grad_(True)
    v, g = fused.mamba2_gate(a, x, A_log, dt_bias, backend="triton")
    assert g.grad_fn is not None
    d = [t.detach().double() for t in (a, x, A_log, dt_bias)]
    v64, g64 = fused.mamba2_gate(*d, dtype=torch.float64, backend="triton")
    assert v64.dtype == g64.dtype == torch.float64
