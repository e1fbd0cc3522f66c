"""`toeplitz_mix` against the dense masked product and the per-token step form (mixers.md §13)."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.toeplitz import (
    fft_size,
    naive_toeplitz_mix,
    normalize_weights,
    toeplitz_mix,
    toeplitz_mix_step,
)
from lt2dsl.kernels.toeplitz.naive import shift_channels
from tests.kernels.utils import assert_close

F64 = torch.float64
VARIANTS = {  # name: (w shape, bias shape) for C = 12 channels, n = 128
    "single": ((128,), (128,)),
    "heads": ((4, 128), (4, 128)),
    "kernel": ((3, 4, 128), (4, 128)),
    "kernel_shared_bias": ((2, 6, 128), (128,)),
}


def make(variant, B=2, T=63, C=12, dtype=F64, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    ws, bs = VARIANTS[variant]
    x = torch.randn(B, T, C, generator=gen, dtype=F64)
    w = torch.randn(*ws, generator=gen, dtype=F64) / 4
    b = torch.randn(*bs, generator=gen, dtype=F64)
    return x.to(dtype).to(device), w.to(device), b.to(device)


def dense(x, w, b):
    w3, b2 = normalize_weights(w, b, x.shape[-1], x.shape[1])
    return naive_toeplitz_mix(x, w3, b2)


def test_fft_size_has_no_wraparound():
    for T in (1, 2, 63, 64, 65, 100, 32768):
        N = fft_size(T)
        assert N >= 2 * T and N & (N - 1) == 0


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fft_equals_dense(T, variant):
    x, w, b = make(variant, T=T)
    assert_close("y", toeplitz_mix(x, w, b), dense(x, w, b), 1e-10)
    assert_close("y no bias", toeplitz_mix(x, w), dense(x, w, None), 1e-10)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_step_equals_dense(variant):
    x, w, b = make(variant, T=40)
    y = dense(x, w, b)
    for t in (1, 2, 17, 40):
        assert_close(f"y_{t}", toeplitz_mix_step(x[:, :t], w, b), y[:, t - 1], 1e-10)


def test_causal_and_position_bias():
    """Changing x at s moves only y_t for t ≥ s; the bias is added per position."""
    x, w, b = make("heads", T=30)
    y = toeplitz_mix(x, w, b)
    x2 = x.clone()
    x2[:, 20] += 1.0
    y2 = toeplitz_mix(x2, w, b)
    assert torch.equal(y[:, :20], y2[:, :20]) or (y[:, :20] - y2[:, :20]).abs().max() < 1e-12
    assert (y[:, 20:] - y2[:, 20:]).abs().max() > 1e-3
    assert_close("bias only", toeplitz_mix(torch.zeros_like(x), w, b)[0, :, 0], b[0, :30], 1e-12)


def test_kernel_variant_channel_window():
    """Output channel c depends on input channels c − k + 1 … c only."""
    x, w, b = make("kernel", T=20)
    x = x.requires_grad_()
    y = toeplitz_mix(x, w, b)
    y[..., 7].sum().backward()
    touched = (x.grad.abs().sum((0, 1)) > 0).nonzero().flatten().tolist()
    assert touched == [5, 6, 7]


@pytest.mark.parametrize("shift", [0, 2, 3, 4, 7])
def test_shift_channels_any_shift(shift):
    """shift_channels keeps the shape for every shift, zero when the shift reaches C."""
    x = torch.arange(1.0, 7.0).reshape(2, 3)
    want = torch.stack(
        [torch.tensor([row[c - shift].item() if c >= shift else 0.0 for c in range(3)]) for row in x]
    )
    assert torch.equal(shift_channels(x, shift), want)


def test_shift_channels_negative_is_a_value_error():
    with pytest.raises(ValueError, match="shift >= 0"):
        shift_channels(torch.zeros(2, 3), -1)


@pytest.mark.parametrize("variant", ["heads", "kernel"])
def test_gradcheck(variant):
    x, w, b = make(variant, B=1, T=9, C=8)
    w = torch.randn(*w.shape[:-1], 16, dtype=F64)
    b = torch.randn(*b.shape[:-1], 16, dtype=F64)
    leaves = [t.requires_grad_() for t in (x, w, b)]
    assert torch.autograd.gradcheck(lambda x, w, b: toeplitz_mix(x, w, b), leaves, fast_mode=True)


def test_fp32_transforms_for_low_precision_inputs():
    x, w, b = make("heads", T=100, dtype=torch.bfloat16)
    y = toeplitz_mix(x, w.float(), b.float())
    assert y.dtype == torch.bfloat16
    assert_close("bf16 y", y, dense(x.double(), w, b), 1e-2)


def test_errors():
    x, w, b = make("heads", T=10)
    with pytest.raises(ValueError, match="max_len"):
        toeplitz_mix(torch.randn(1, 129, 12, dtype=F64), w)
    with pytest.raises(ValueError, match="divisible"):
        toeplitz_mix(x[..., :10], w)
    with pytest.raises(ValueError, match=r"\[heads, n\]"):
        toeplitz_mix(x, w, b[:2])
    with pytest.raises(ValueError, match=r"\[B, T, C\]"):
        toeplitz_mix(x[0], w)
    with pytest.raises(ValueError, match=r"\[n\], \[heads, n\]"):
        toeplitz_mix(x, w[None, None])
    with pytest.raises(ValueError, match="max_len"):
        toeplitz_mix_step(torch.randn(1, 129, 12, dtype=F64), w)


# ---------------------------------------------------------------------------------------------
# backend="triton": cuFFT (torch.fft on CPU) with the fused Triton passes; interpreter on CPU

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def check_triton(x, w, b, tol):
    """Triton forward and all gradients versus the float64 dense product."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b) if t is not None]
    y = toeplitz_mix(*leaves, backend="triton")
    gen = torch.Generator().manual_seed(3)
    dy = torch.randn(*y.shape, generator=gen, dtype=F64).to(y.device)
    (y.double() * dy).sum().backward()
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    y_ref = dense(ref_leaves[0], ref_leaves[1], ref_leaves[2] if b is not None else None)
    (y_ref * dy).sum().backward()
    assert y.dtype == x.dtype
    assert_close("y", y, y_ref, tol)
    for name, a, r in zip(["dx", "dw", "db"], leaves, ref_leaves):
        assert_close(name, a.grad, r.grad, tol)


@pytest.mark.parametrize(("variant", "T", "dtype"), [
    ("single", 63, torch.float32), ("heads", 100, torch.bfloat16), ("kernel", 100, torch.float32),
    ("kernel_shared_bias", 1, torch.float32), ("kernel", 37, torch.bfloat16),
])  # fmt: skip
def test_triton_matches_dense(poison, variant, T, dtype):
    x, w, b = make(variant, T=T)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    check_triton(x.to(dtype).to(DEVICE), w.float().to(DEVICE), b.float().to(DEVICE), tol)


def test_triton_without_bias(poison):
    x, w, _ = make("kernel", T=50)
    check_triton(x.float().to(DEVICE), w.float().to(DEVICE), None, 1e-4)


@pytest.mark.parametrize("variant", ["single", "kernel"])
def test_triton_step(poison, variant):
    x, w, b = make(variant, T=100)
    x, w, b = x.float().to(DEVICE), w.float().to(DEVICE), b.float().to(DEVICE)
    y = dense(x.double(), w.double(), b.double())
    for t in (1, 64, 100):
        assert_close(f"y_{t}", toeplitz_mix_step(x[:, :t], w, b, backend="triton"), y[:, t - 1], 1e-5)


def test_triton_compiles_fullgraph_and_counts_flops(poison):
    from torch.utils.flop_counter import FlopCounterMode

    x, w, b = make("heads", T=30)
    leaves = [t.float().to(DEVICE).requires_grad_() for t in (x, w, b)]

    def f(x, w, b):
        return toeplitz_mix(x, w, b, backend="triton")

    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    y = torch.compile(f, fullgraph=True, backend=backend)(*leaves)
    y.sum().backward()
    assert_close("compiled y", y, dense(*(t.detach().double() for t in leaves)), 1e-5)
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)
    with FlopCounterMode(display=False) as counter:
        f(*leaves).sum().backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert counts["lt2dsl.toeplitz_fft"] == 2 * 30 * 12 * (10 * 6 + 6)  # N = 64
    assert counts["lt2dsl.toeplitz_fft_bwd"] == 2 * counts["lt2dsl.toeplitz_fft"]


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1000, 8192, 32768])
@pytest.mark.parametrize("variant", ["heads", "kernel"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_full_size(poison, T, variant, dtype):
    gen = torch.Generator().manual_seed(0)
    ws = {"heads": (16, T), "kernel": (3, 16, T)}[variant]
    x = torch.randn(2, T, 256, generator=gen, dtype=F64)
    w = torch.randn(*ws, generator=gen, dtype=F64) / T**0.5
    b = torch.randn(16, T, generator=gen, dtype=F64)
    # float64 FFT reference (the dense product needs T² memory at 32k)
    leaves = [t.detach().to(DEVICE).requires_grad_() for t in (x.to(dtype), w.float(), b.float())]
    y = toeplitz_mix(*leaves, backend="triton")
    dy = torch.randn(*y.shape, generator=gen, dtype=F64).to(DEVICE)
    (y.double() * dy).sum().backward()
    ref = [t.detach().double().requires_grad_() for t in leaves]
    y_ref = toeplitz_mix(*ref, backend="reference")
    (y_ref * dy).sum().backward()
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    assert_close("y", y, y_ref, tol)
    for name, a, r in zip(["dx", "dw", "db"], leaves, ref):
        assert_close(name, a.grad, r.grad, tol)
    step = toeplitz_mix_step(leaves[0].detach(), leaves[1].detach(), leaves[2].detach(), backend="triton")
    assert_close("decode step", step, y_ref[:, -1], tol)
