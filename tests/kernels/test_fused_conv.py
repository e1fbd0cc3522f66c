"""Fused short conv (`lt2dsl.kernels.fused.conv_silu`): causal depthwise conv + SiLU (+ L2Norm per
head) with a decode history, Triton (CPU interpreter here) against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.kernels.fused.testing import assert_close, check_against_reference
from lt2dsl.lowering import functional
from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.fx_passes.leaves import conv_silu_cached

# the Triton kernels compiled on a GPU, else through the CPU interpreter (tests/conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {
    # (B, T, C, W, head_dim, history, bias)
    "B2-T9-C24-W4": (2, 9, 24, 4, 0, False, False),
    "B2-T9-C24-W4-hist-bias": (2, 9, 24, 4, 0, True, True),
    "B1-T70-C40-W3-l2-hd8": (1, 70, 40, 3, 8, False, False),
    "B2-T5-C24-W4-l2-hd12-hist": (2, 5, 24, 4, 12, True, False),
    "B3-T1-C200-W4-decode": (3, 1, 200, 4, 0, True, True),
    "B2-T2-C16-W4-l2-hd16-decode": (2, 2, 16, 4, 16, True, False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_conv_silu(case, dtype):
    B, T, C, W, hd, has_hist, has_bias = case
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(B, T, C, generator=g), torch.randn(C, 1, W, generator=g)
    b = torch.randn(C, generator=g) if has_bias else None
    hist = torch.randn(B, C, W - 1, generator=g).to(dtype).double().to(DEVICE) if has_hist else None

    def tri(x, w, b):
        h = None if hist is None else hist.to(dtype)
        return fused.conv_silu(x, w, b, h, head_dim=hd, backend="triton")

    def ref(x, w, b):
        return naive.conv_silu_ref(x, w, b, hist, hd)

    check_against_reference("conv_silu", tri, ref, (x, w, b), dtype, device=DEVICE)


def test_conv_reads_a_column_slice():
    """x as a column slice of a wider GEMM output (what `norm_proj` produces)."""
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(2, 7, 50, generator=g).to(DEVICE)
    x, w = wide[:, :, 10:34], torch.randn(24, 1, 4, generator=g).to(DEVICE)
    got = fused.conv_silu(x, w, None, None, head_dim=8, backend="triton")
    assert_close("slice", got, naive.conv_silu_ref(x.double(), w.double(), None, None, 8), 2e-5)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_cached_conv_matches_short_conv_and_its_cache(backend):
    """`conv_silu_cached` keeps exactly `short_conv`'s cache: prefill then decode steps."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 8, 12, generator=g).to(DEVICE), torch.randn(12, 1, 4, generator=g).to(DEVICE)
    b = torch.randn(12, generator=g).to(DEVICE)
    ref_entry, entry = Entry(), Entry()
    for lo, hi in [(0, 2), (2, 6), (6, 7), (7, 8)]:
        want = functional.short_conv(x[:, lo:hi], w, b, ref_entry, "c")
        got = conv_silu_cached(x[:, lo:hi], w, b, entry, "c", backend=backend)
        assert_close(f"conv {lo}:{hi}", got, want, 1e-6)
        assert entry["c"].shape == ref_entry["c"].shape and entry["c"].is_contiguous()
        torch.testing.assert_close(entry["c"], ref_entry["c"], rtol=0, atol=0)


def test_op_compiles_fullgraph_and_counts_flops():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 16, generator=g).to(DEVICE).requires_grad_()
    w = torch.randn(16, 1, 4, generator=g).to(DEVICE).requires_grad_()
    hist = torch.randn(2, 16, 3, generator=g).to(DEVICE)

    def f(x, w):
        return fused.conv_silu(x, w, None, hist, head_dim=8, backend="triton")

    eager = f(x, w)
    ge = torch.autograd.grad(eager.square().sum(), (x, w))
    comp = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w)
    gc = torch.autograd.grad(comp.square().sum(), (x, w))
    torch.testing.assert_close(comp, eager)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b)
    with FlopCounterMode(display=False) as fc:
        f(x, w)
    assert fc.get_total_flops() == 2 * 2 * 6 * 16 * 4


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [0, 128], ids=["plain", "l2-hd128"])
def test_conv_on_gpu_at_model_shapes(head_dim):
    """B=4, T=2048, C=4096 (GDN v) / 2048 (q, k with L2Norm), bf16, the config autotuning picks."""
    C = 4096 if head_dim == 0 else 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4, 2048, C, device="cuda", generator=g)
    w = torch.randn(C, 1, 4, device="cuda", generator=g)

    def tri(x, w):
        return fused.conv_silu(x, w, None, None, head_dim=head_dim, backend="triton")

    def ref(x, w):
        return naive.conv_silu_ref(x, w, None, None, head_dim)

    check_against_reference("conv_silu", tri, ref, (x, w), torch.bfloat16)
