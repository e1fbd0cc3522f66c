"""The blocked DFT form of `toeplitz_mix` (16-bit inputs): its math in float64, then the Triton
kernels against the float64 dense product, forward and every gradient (blocked.py, blocked_ref.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import lt2dsl.kernels.toeplitz.ops  # noqa: F401  (registers lt2dsl::toeplitz_blocked)
from lt2dsl.kernels.toeplitz import naive_toeplitz_mix, toeplitz_mix
from lt2dsl.kernels.toeplitz.blocked_ref import (
    block_size,
    blocked_toeplitz_mix,
    dft_matrices,
    mix_blocks,
    spectra,
    window_spectra,
)
from lt2dsl.kernels.toeplitz.recipe import RECIPES
from tests.kernels.utils import DEVICE, assert_close, rel_rms

F64 = torch.float64


def data(B, T, C, heads, n=None, dtype=F64, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    n = n or T + 3
    x = torch.randn(B, T, C, generator=gen, dtype=F64)
    w = torch.randn(heads, n, generator=gen, dtype=F64) / T**0.5
    b = torch.randn(heads, n, generator=gen, dtype=F64) if bias else None
    return x.to(dtype), w, b


def dense(x, w, b):
    return naive_toeplitz_mix(x.double(), w.double()[None], None if b is None else b.double())


# ---------------------------------------------------------------------------------------------
# the math, float64


@pytest.mark.parametrize(
    ("T", "S", "heads"), [(1, 16, 1), (63, 16, 1), (100, 16, 4), (128, 32, 2), (1000, 64, 1)]
)
def test_blocked_form_equals_dense(T, S, heads):
    x, w, b = data(2, T, 8, heads)
    assert_close("y", blocked_toeplitz_mix(x, w, b, S), dense(x, w, b), 1e-12)


@pytest.mark.parametrize("heads", [1, 2])
def test_block_product_transpose_is_its_adjoint(heads):
    T, S = 200, 16
    x, w, _ = data(2, T, 4, heads)
    F, _ = dft_matrices(S)
    V = window_spectra(w, T, S)
    X = spectra(x, F, S)
    Z = torch.randn_like(X)
    lhs = (mix_blocks(X, V, heads) * Z).sum()
    rhs = (X * mix_blocks(Z, V, heads, transpose=True)).sum()
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)


def test_kernel_spectra_and_their_adjoint():
    """The window-DFT kernel gives window_spectra; kernel_grad (the backward's dw from dV) is its
    adjoint (autograd through the float64 form)."""
    from lt2dsl.kernels.toeplitz.blocked import Plan, kernel_grad, kernel_spectra

    T, S, n = 300, 32, 310
    w = torch.randn(3, n, dtype=F64, requires_grad=True)
    plan = Plan(T, S, torch.bfloat16, torch.device(DEVICE))
    V_ref = window_spectra(w, T, S)
    # the GPU forms V with tf32 dots: every use rounds it to bf16
    tol = 2e-3 if DEVICE == "cuda" else 1e-5
    assert_close("V", kernel_spectra(w.detach().float().to(DEVICE), plan).cpu(), V_ref, tol)
    dV = torch.randn_like(V_ref)
    (V_ref * dV).sum().backward()
    assert_close("dw", kernel_grad(dV.float().to(DEVICE), plan, n).cpu(), w.grad, 1e-5)


def test_block_size_balances_the_passes():
    assert block_size(100) == 64 and block_size(8192) == 64 and block_size(32768) == 128


# ---------------------------------------------------------------------------------------------
# Triton kernels (interpreter on CPU, compiled on the GPU)


def check(x, w, b, S, tol, device=DEVICE, recipe=""):
    """Blocked op forward and all gradients (by the named recipe) against the float64 dense product."""
    inputs = (x, w.float(), None if b is None else b.float())
    leaves = [t.detach().to(device).requires_grad_() for t in inputs if t is not None]
    xl, wl = leaves[0], leaves[1]
    bl = leaves[2] if b is not None else None
    y = torch.ops.lt2dsl.toeplitz_blocked(xl, wl, bl, S, recipe)
    assert y.dtype == x.dtype and y.shape == x.shape
    gen = torch.Generator().manual_seed(3)
    dy = torch.randn(*y.shape, generator=gen, dtype=F64)
    (y.double() * dy.to(device)).sum().backward()
    ref = [t.detach().double().cpu().requires_grad_() for t in leaves]
    y_ref = dense(ref[0], ref[1], ref[2] if b is not None else None)
    (y_ref * dy).sum().backward()
    assert_close("y", y.cpu(), y_ref, tol)
    for name, a, r in zip(["dx", "dw", "db"], leaves, ref):
        assert torch.isfinite(a.grad).all(), name
        assert_close(name, a.grad.cpu(), r.grad, tol)


@pytest.mark.parametrize(
    ("B", "T", "C", "heads", "S", "dtype", "bias"),
    [
        (2, 63, 12, 1, 64, torch.bfloat16, True),  # one block, columns masked
        (2, 100, 64, 2, 64, torch.bfloat16, True),  # two heads of 32 channels
        (1, 1, 32, 1, 16, torch.bfloat16, False),
        (1, 1100, 32, 1, 16, torch.bfloat16, True),  # 69 blocks: several block tiles, both directions
        (2, 40, 256, 1, 16, torch.float16, True),  # 512 columns: the correlation splits them
        (1, 77, 96, 3, 16, torch.float16, False),
    ],
)
def test_triton_blocked_matches_dense(poison, B, T, C, heads, S, dtype, bias):
    x, w, b = data(B, T, C, heads, dtype=dtype, bias=bias)
    check(x, w, b, S, 1e-2)


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize(("B", "T", "C", "heads", "S"), [(2, 100, 64, 2, 16), (1, 1100, 32, 1, 16)])
def test_triton_blocked_recipes(poison, recipe, B, T, C, heads, S):
    """Pass 2 from the precomputed Toeplitz tiles ("tiles") and gathering them from the packed
    spectra ("gather", the default where the tiles would exceed TILE_BYTES): the same results."""
    x, w, b = data(B, T, C, heads, dtype=torch.bfloat16)
    check(x, w, b, S, 1e-2, recipe=recipe)


def test_recipes_are_chosen_by_shape_and_named_ones_are_checked(poison):
    from lt2dsl.kernels.toeplitz.recipe import TILE_BYTES, default_recipe, tile_bytes

    assert default_recipe(1, 32768, 128) == RECIPES["tiles"]
    assert tile_bytes(64, 128, 256) > TILE_BYTES and default_recipe(64, 32768, 128) == RECIPES["gather"]
    x, w, _ = data(1, 50, 32, 1, dtype=torch.bfloat16)
    x, w = x.to(DEVICE), w.float().to(DEVICE)
    with pytest.raises(ValueError, match="unknown Toeplitz recipe 'dense'; known: tiles, gather"):
        toeplitz_mix(x, w, backend="triton", recipe="dense")
    with pytest.raises(ValueError, match="the FFT path"):
        toeplitz_mix(x, w, backend="triton", method="fft", recipe="gather")


@pytest.mark.parametrize("OT", [2, 4])
@pytest.mark.parametrize(("B", "T", "C", "heads", "S"), [(2, 100, 64, 2, 16), (1, 1100, 32, 1, 16)])
def test_triton_blocked_several_output_tiles_a_program(poison, monkeypatch, OT, B, T, C, heads, S):
    """Pass 2 with OT output tiles a program (the interpreter runs only the first config, OT = 1):
    1100 samples are 3 tiles of 32 blocks, so the last group has tiles past the end."""
    import triton

    from lt2dsl.kernels.toeplitz import blocked

    pinned = [triton.Config({"BC": 32, "OT": OT}, num_warps=4)]
    monkeypatch.setattr(blocked.mix_tiles_kernel, "configs", pinned)
    x, w, b = data(B, T, C, heads, dtype=torch.bfloat16)
    check(x, w, b, S, 1e-2)


def test_autograd_function_path_equals_the_registered_op(poison):
    """Eager calls that autograd records take BlockedFunction (less host time); same results."""
    x, w, b = data(1, 70, 32, 1, dtype=torch.bfloat16)
    outs = []
    for use_op in (False, True):
        leaves = [t.detach().to(DEVICE).float().requires_grad_() for t in (w, b)]
        xl = x.to(DEVICE).requires_grad_()
        if use_op:
            y = torch.ops.lt2dsl.toeplitz_blocked(xl, leaves[0], leaves[1], 64, "")
        else:
            y = toeplitz_mix(xl, leaves[0], leaves[1], backend="triton")
            assert type(y.grad_fn).__name__ == "BlockedFunctionBackward"
        y.float().pow(2).sum().backward()
        outs.append([y, xl.grad, *(t.grad for t in leaves)])
    for name, a, r in zip(["y", "dx", "dw", "db"], *outs):
        assert torch.equal(a, r), name


def test_kernel_tables_follow_in_place_updates(poison):
    """The cached kernel tables are rebuilt when w changes in place (an optimizer step) or when
    another tensor object sits at the same address with the same version counter."""
    from lt2dsl.kernels.toeplitz import blocked

    x, w, _ = data(1, 60, 32, 1, dtype=torch.bfloat16)
    x, w = x.to(DEVICE), w.float().to(DEVICE)
    y1 = toeplitz_mix(x, w, backend="triton")
    assert_close("y", y1.float(), dense(x, w, None).float(), 1e-2)
    assert toeplitz_mix(x, w, backend="triton").equal(y1)  # a hit gives the same bits
    with torch.no_grad():
        w.mul_(-2.0)
    assert_close("y after w.mul_", toeplitz_mix(x, w, backend="triton").float(), -2 * y1.float(), 1e-2)
    plan = blocked.Plan(60, 64, torch.bfloat16, x.device)
    V, _ = blocked.kernel_tables(w, plan)
    assert blocked.kernel_tables(w[:], plan)[0] is V  # a new view of the same w: a hit
    # same address, same version counter, another tensor object: must not hit
    other = w.detach()
    assert other.data_ptr() == w.data_ptr() and other._version == w._version
    assert blocked.kernel_tables(other, plan)[0] is not V


def test_dispatch_and_methods(poison):
    """auto: blocked for 16-bit x with one kernel; fft for fp32, the kernel variant and narrow heads."""
    x, w, b = data(1, 50, 32, 1, dtype=torch.bfloat16)
    x, w, b = x.to(DEVICE), w.float().to(DEVICE), b.float().to(DEVICE)

    def ops(**kw):
        with FlopCounterMode(display=False) as counter:
            y = toeplitz_mix(x if "x" not in kw else kw.pop("x"), kw.pop("w", w), b, backend="triton", **kw)
        return y, {str(op) for op in counter.get_flop_counts()["Global"]}

    y_auto, used = ops()
    assert used == {"lt2dsl.toeplitz_blocked"}
    y_fft, used = ops(method="fft")
    assert used == {"lt2dsl.toeplitz_fft"}
    assert_close("blocked vs fft", y_auto, y_fft.float(), 1e-2)
    assert ops(x=x.float())[1] == {"lt2dsl.toeplitz_fft"}
    assert ops(w=w.expand(2, 1, w.shape[-1]).contiguous())[1] == {"lt2dsl.toeplitz_fft"}
    with pytest.raises(ValueError, match="method='blocked' needs"):
        toeplitz_mix(x.float(), w, b, backend="triton", method="blocked")
    with pytest.raises(ValueError, match="multiple of 32"):
        toeplitz_mix(x[..., :24], w.expand(2, -1), None, backend="triton", method="blocked")
    with pytest.raises(ValueError, match="`method` must be one of"):
        toeplitz_mix(x, w, b, backend="triton", method="dense")


def test_compiles_fullgraph_and_counts_flops(poison):
    from lt2dsl.kernels.toeplitz.ops import blocked_flops

    x, w, b = data(1, 30, 32, 1, dtype=torch.bfloat16)
    leaves = [t.to(DEVICE).requires_grad_() for t in (x, w.float(), b.float())]

    def f(x, w, b):
        return toeplitz_mix(x, w, b, backend="triton")

    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    y = torch.compile(f, fullgraph=True, backend=backend)(*leaves)
    y.float().sum().backward()
    assert_close("compiled y", y.float(), dense(*(t.detach() for t in leaves)).float(), 1e-2)
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)
    with FlopCounterMode(display=False) as counter:
        f(*leaves).float().sum().backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    S, M = 64, 1
    assert counts["lt2dsl.toeplitz_blocked"] == 1 * M * S * 32 * (8 * S + 4 * (M + 1))
    assert counts["lt2dsl.toeplitz_blocked_bwd"] == blocked_flops((1, 30, 32), S, backward=True)


# ---------------------------------------------------------------------------------------------
# GPU: full sizes, every autotune config, accuracy next to the dense bf16 product


def _fft_reference(x, w, b):
    """float64 by FFT (the dense product needs T² memory at 32k)."""
    from lt2dsl.kernels.toeplitz import fft_toeplitz_mix

    return fft_toeplitz_mix(x, w[None], b)


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("T", [1000, 8192, 32768])
@pytest.mark.parametrize(("C", "heads"), [(256, 1), (512, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_full_size(poison, T, C, heads, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, T, C, generator=gen, dtype=F64)
    w = torch.randn(heads, T, generator=gen, dtype=F64) / T**0.5
    b = torch.randn(heads, T, generator=gen, dtype=F64)
    leaves = [t.detach().cuda().requires_grad_() for t in (x.to(dtype), w.float(), b.float())]
    y = toeplitz_mix(*leaves, backend="triton", method="blocked")
    dy = torch.randn(*y.shape, generator=gen, dtype=F64).cuda()
    (y.double() * dy).sum().backward()
    ref = [t.detach().double().requires_grad_() for t in leaves]
    y_ref = _fft_reference(*ref)
    (y_ref * dy).sum().backward()
    assert_close("y", y, y_ref, 1e-2)
    for name, a, r in zip(["dx", "dw", "db"], leaves, ref):
        assert_close(name, a.grad, r.grad, 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_gpu_every_autotune_config(poison, recipe):
    from lt2dsl.kernels.common.tiles import force_config, max_configs

    x, w, b = data(2, 1000, 256, 1, dtype=torch.bfloat16)
    for config in range(max_configs()):
        force_config(config)
        try:
            check(x, w, b, 16, 1e-2, device="cuda", recipe=recipe)  # 63 blocks of 16: every tile path
            check(x, w, b, 64, 1e-2, device="cuda", recipe=recipe)
        finally:
            force_config(None)


@pytest.mark.gpu
def test_gpu_repeated_calls_on_the_kept_kernels(poison):
    """From the second call of a shape on, the passes launch their kept CompiledKernels
    (`toeplitz/launch.py`): new inputs each call, an input 2 bytes off a 16-byte boundary (a new
    specialization) in between, and every result against float64."""
    from lt2dsl.kernels.toeplitz import launch

    launch.clear()
    before = launch.COUNTS["fast"]
    for seed, offset in [(0, 0), (1, 0), (2, 1), (3, 1), (4, 0)]:
        x, w, b = data(2, 1000, 256, 1, dtype=torch.bfloat16, seed=seed)
        buf = torch.empty(x.numel() + 8, dtype=x.dtype, device="cuda")
        xd = buf[offset : offset + x.numel()].view(x.shape).copy_(x)
        assert (xd.data_ptr() % 16 == 0) == (offset == 0)
        y = toeplitz_mix(xd, w.float().cuda(), b.float().cuda(), backend="triton", method="blocked")
        assert_close("y", y.cpu(), dense(x, w, b), 1e-2)
    assert launch.COUNTS["fast"] - before >= 6  # three passes, calls 2 and 4 at least


@pytest.mark.gpu
@pytest.mark.gpu_heavy
def test_gpu_accuracy_next_to_the_dense_bf16_product():
    """At T = 8192 the blocked path's error stays within 2× the dense bf16 product's (w rounded)."""
    x, w, _ = data(1, 8192, 256, 1, dtype=torch.bfloat16)
    x, w = x.cuda(), w.cuda()
    ref = _fft_reference(x.double(), w, None)
    lag = torch.arange(8192, device="cuda")[:, None] - torch.arange(8192, device="cuda")[None, :]
    Md = torch.where(lag >= 0, w[0].bfloat16()[lag.clamp(min=0)], 0)
    err_dense = rel_rms(torch.einsum("ts,bsc->btc", Md, x), ref)
    err_ours = rel_rms(toeplitz_mix(x, w.float(), backend="triton", method="blocked"), ref)
    print(f"relative RMS error: blocked {err_ours:.2e}, dense bf16 {err_dense:.2e}")
    assert err_ours <= 2 * err_dense
