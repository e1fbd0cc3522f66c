"""Fused activations (`lt2dsl.kernels.fused`): the GDN gates and SwiGLU, Triton (CPU interpreter
here) against the float64 references, forward and backward, strided (column-slice) inputs."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.kernels.fused.testing import assert_close, check_against_reference

# the Triton kernels compiled on a GPU, else through the CPU interpreter (tests/conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("B", "T", "HV", "beta_scale"),
    [(2, 9, 3, 1.0), (1, 300, 16, 2.0), (3, 1, 6, 1.0)],
    ids=["B2-T9-HV3", "B1-T300-HV16-neg_eigval", "B3-T1-HV6"],
)
def test_gdn_gate(B, T, HV, beta_scale, dtype):
    g = torch.Generator().manual_seed(0)
    # a spans softplus's regimes: far negative (log1p path), moderate, past the threshold 20
    a = torch.cat(
        [torch.randn(B, T, HV, generator=g) * 4, torch.full((B, 1, HV), 25.0), torch.full((B, 1, HV), -30.0)],
        dim=1,
    )
    b = torch.randn(B, T + 2, HV, generator=g) * 3
    A_log, dt_bias = torch.rand(HV, generator=g) * 2.7, torch.randn(HV, generator=g)

    def tri(a, b, A_log, dt_bias):
        return fused.gdn_gate(a, b, A_log, dt_bias, beta_scale=beta_scale, backend="triton")

    def ref(a, b, A_log, dt_bias):
        return naive.gdn_gate_ref(a, b, A_log, dt_bias, beta_scale, torch.float64)

    check_against_reference("gdn_gate", tri, ref, (a, b, A_log, dt_bias), dtype, device=DEVICE)


def test_gdn_gate_reads_column_slices_and_writes_fp32():
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(2, 5, 20, generator=g, dtype=torch.bfloat16).to(DEVICE)
    a, b = wide[..., 3:7], wide[..., 11:15]
    A_log, dt_bias = torch.rand(4, generator=g).to(DEVICE), torch.randn(4, generator=g).to(DEVICE)
    gg, beta = fused.gdn_gate(a, b, A_log, dt_bias, backend="triton")
    assert gg.dtype == beta.dtype == torch.float32 and gg.shape == (2, 5, 4)
    rg, rb = naive.gdn_gate_ref(a.double(), b.double(), A_log.double(), dt_bias.double(), 1.0, torch.float64)
    assert_close("g", gg, rg, 1e-6)
    assert_close("beta", beta, rb, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 7, 40), (1, 3, 1500), (5, 1)], ids=["B2-T7-F40", "B1-T3-F1500", "F1"])
def test_swiglu(shape, dtype):
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(*shape, generator=g) * 3, torch.randn(*shape, generator=g)
    check_against_reference(
        "swiglu",
        lambda a, b: fused.swiglu(a, b, backend="triton"),
        naive.swiglu_ref,
        (a, b),
        dtype,
        device=DEVICE,
    )


def test_ops_compile_fullgraph():
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(2, 5, 24, generator=g).to(DEVICE).requires_grad_()
    A_log, dt_bias = (torch.randn(4, generator=g).to(DEVICE).requires_grad_() for _ in range(2))

    def f(wide, A_log, dt_bias):
        gg, beta = fused.gdn_gate(wide[..., :4], wide[..., 4:8], A_log, dt_bias, backend="triton")
        h = fused.swiglu(wide[..., 8:16], wide[..., 16:], backend="triton")
        return h.sum(-1) + (gg * beta).sum(-1)

    args = (wide, A_log, dt_bias)
    eager = f(*args)
    ge = torch.autograd.grad(eager.square().sum(), args)
    comp = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    gc = torch.autograd.grad(comp.square().sum(), args)
    torch.testing.assert_close(comp, eager)
    for x, y in zip(gc, ge):
        torch.testing.assert_close(x, y)


@pytest.mark.gpu
def test_activations_on_gpu_at_model_shapes():
    """B=4, T=2048: GDN gates over HV=16 heads, SwiGLU over 5632 channels, bf16."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(4, 2048, 16, device="cuda", generator=g) * 3 for _ in range(2))
    A_log = torch.rand(16, device="cuda", generator=g) * 2.7
    dt_bias = torch.randn(16, device="cuda", generator=g)
    check_against_reference(
        "gdn_gate",
        lambda *t: fused.gdn_gate(*t, backend="triton"),
        lambda *t: naive.gdn_gate_ref(*t, 1.0, torch.float64),
        (a, b, A_log, dt_bias),
        torch.bfloat16,
    )
    x, y = (torch.randn(4, 2048, 5632, device="cuda", generator=g) for _ in range(2))
    check_against_reference(
        "swiglu", lambda a, b: fused.swiglu(a, b, backend="triton"), naive.swiglu_ref, (x, y), torch.bfloat16
    )
