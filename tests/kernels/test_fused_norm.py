"""Fused norms (`lt2dsl.kernels.fused`): residual add + RMSNorm and gated RMSNorm + output
projection, Triton (CPU interpreter here) against the float64 references, forward and backward."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.kernels.fused.testing import assert_close, check_against_reference

# the Triton kernels compiled on a GPU, else through the CPU interpreter (tests/conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

DTYPES = [torch.float32, torch.bfloat16]


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("shape", "eps"),
    [((2, 7, 48), 1e-6), ((3, 5, 100), None), ((1, 1, 8), 1e-5)],
    ids=["B2-T7-D48", "B3-T5-D100-eps_none", "B1-T1-D8"],
)
def test_add_rmsnorm(shape, eps, dtype):
    g = _g()
    x, r = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    w = torch.randn(shape[-1], generator=g)

    def tri(x, r, w):
        return fused.add_rmsnorm(x, r, w, eps, backend="triton")

    def ref(x, r, w):
        e = torch.finfo(dtype).eps if eps is None else eps
        return naive.add_rmsnorm_ref(x, r, w, e)

    check_against_reference("add_rmsnorm", tri, ref, (x, r, w), dtype, device=DEVICE)


def test_add_rmsnorm_falls_back_where_the_kernel_does_not_apply():
    """float64 and broadcast residuals run the reference even with backend="triton"."""
    x, w = torch.randn(2, 3, 8, dtype=torch.float64, device=DEVICE), torch.ones(8, device=DEVICE)
    for r in (x.flip(0), torch.randn(8, dtype=torch.float64, device=DEVICE)):
        n, s = fused.add_rmsnorm(x, r, w.double(), 1e-6, backend="triton")
        n2, s2 = naive.add_rmsnorm_ref(x, r, w.double(), 1e-6)
        assert torch.equal(n, n2) and torch.equal(s, s2)
    x, r = x.float(), torch.randn(8, device=DEVICE)
    n, s = fused.add_rmsnorm(x, r, w, 1e-6, backend="triton")
    n2, s2 = naive.add_rmsnorm_ref(x, r, w, 1e-6)
    assert torch.equal(n, n2) and torch.equal(s, s2)


CASES = {
    # (o shape, weight dim, group, act, norm_before_gate, n_flat, out features)
    "gdn-heads-silu": ((2, 9, 3, 16), 16, 16, "silu", True, 2, 24),
    "deltanet-nogate": ((2, 9, 2, 12), 12, 12, None, True, 2, 10),
    "kda-sigmoid": ((1, 5, 2, 8), 8, 8, "sigmoid", True, 2, 7),
    "mamba2-groups": ((2, 6, 24), 24, 8, "silu", False, 1, 16),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_gated_rmsnorm_linear(case, dtype):
    shape, dim, group, act, nbg, n_flat, D = case
    g = _g(1)
    L = torch.Size(shape[len(shape) - n_flat :]).numel()
    o, gate = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    nw, pb = 1 + 0.1 * torch.randn(dim, generator=g), torch.randn(D, generator=g)
    pw = torch.randn(D, L, generator=g)
    kw = {"eps": 1e-5, "act": act, "group": group, "norm_before_gate": nbg, "n_flat": n_flat}

    def tri(o, gate, nw, pw, pb):
        return fused.gated_rmsnorm_linear(o, gate, nw, pw, pb, backend="triton", **kw)

    def ref(o, gate, nw, pw, pb):
        return naive.gated_rmsnorm_linear_ref(o, gate, nw, pw, pb, kw["eps"], act, group, nbg, n_flat)

    inputs = (o, gate if act else None, nw, pw, pb)
    check_against_reference("gated_rmsnorm_linear", tri, ref, inputs, dtype, device=DEVICE)


def test_gated_rmsnorm_reads_strided_gates():
    """The gate as a column slice of a wider GEMM output (what `norm_proj` produces)."""
    g = _g(2)
    o = torch.randn(2, 5, 2, 8, generator=g).to(DEVICE)
    wide = torch.randn(2, 5, 40, generator=g).to(DEVICE)
    gate = wide[..., 8:24].unflatten(-1, (2, 8))
    nw, pw = (torch.rand(8, generator=g) + 0.5).to(DEVICE), torch.randn(6, 16, generator=g).to(DEVICE)
    kw = {"eps": 1e-5, "act": "silu", "group": 8, "n_flat": 2}
    out = fused.gated_rmsnorm_linear(o, gate, nw, pw, None, backend="triton", **kw)
    want = naive.gated_rmsnorm_linear_ref(
        o.double(), gate.double(), nw.double(), pw.double(), None, 1e-5, "silu", 8, True, 2
    )
    assert_close("strided gate", out, want, 2e-5)


def test_ops_compile_fullgraph_and_count_flops():
    g = _g(3)
    shapes = [(2, 5, 16), (2, 5, 16), (16,), (2, 5, 2, 8), (8,), (16, 16)]
    x, r, w, o, nw, pw = (torch.randn(*s, generator=g).to(DEVICE).requires_grad_() for s in shapes)
    kw = {"eps": 1e-5, "act": "silu", "group": 8, "n_flat": 2, "backend": "triton"}

    def f(x, r, w, o, nw, pw):
        n, s = fused.add_rmsnorm(x, r, w, 1e-6, backend="triton")
        return fused.gated_rmsnorm_linear(o, n.unflatten(-1, (2, 8)), nw, pw, None, **kw) + s

    args = (x, r, w, o, nw, pw)
    eager = f(*args)
    ge = torch.autograd.grad(eager.square().sum(), args)
    comp = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    gc = torch.autograd.grad(comp.square().sum(), args)
    torch.testing.assert_close(comp, eager, rtol=1e-6, atol=1e-6)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with FlopCounterMode(display=False) as fc:
        f(*args)
    assert fc.get_total_flops() == 2 * 10 * 16 * 16


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_norms_on_gpu_at_model_shapes(dtype):
    """H200 shapes of the bench (B=4, T=2048, D=2048; GDN heads 16 × V 256), the configs autotuning picks."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x, r = (torch.randn(4, 2048, 2048, device="cuda", generator=g) for _ in range(2))
    w = torch.randn(2048, device="cuda", generator=g)
    check_against_reference(
        "add_rmsnorm",
        lambda x, r, w: fused.add_rmsnorm(x, r, w, 1e-6, backend="triton"),
        lambda x, r, w: naive.add_rmsnorm_ref(x, r, w, 1e-6),
        (x, r, w),
        dtype,
    )
    o, gate = (torch.randn(4, 2048, 16, 256, device="cuda", generator=g) for _ in range(2))
    nw = torch.rand(256, device="cuda", generator=g) + 0.5
    pw = torch.randn(2048, 4096, device="cuda", generator=g) / 64
    kw = {"eps": 1e-5, "act": "silu", "group": 256, "n_flat": 2}

    def tri(o, gate, nw, pw):
        return fused.gated_rmsnorm_linear(o, gate, nw, pw, None, backend="triton", **kw)

    def ref(o, gate, nw, pw):
        return naive.gated_rmsnorm_linear_ref(o, gate, nw, pw, None, 1e-5, "silu", 256, True, 2)

    check_against_reference("gated_rmsnorm_linear", tri, ref, (o, gate, nw, pw), dtype)
