"""Checks of a fused op against its reference, shared by the kernel tests and `bench/blocks.py`.

The Triton path runs in the op's dtype, the reference in float64 on the same (rounded) inputs;
outputs and input gradients are compared by relative RMS error (fla's `assert_close`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# relative RMS tolerances of the Triton paths against float64 (fp32 math in the kernels)
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2}


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN or Inf anywhere gives inf."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out).all():
        return float("inf")
    den = ref.norm().item()
    return (out - ref).norm().item() / den if den > 0 else (out - ref).norm().item()


def assert_close(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    err = rel_rms(out, ref)
    max_abs = (out.detach().double().cpu() - ref.detach().double().cpu()).abs().max().item()
    assert err <= tol, f"{name}: relative RMS error {err:.3e} > {tol:.1e} (max abs {max_abs:.3e})"


def leaves(*ts: torch.Tensor | None, dtype: torch.dtype, device=None) -> list[torch.Tensor | None]:
    """Detached copies in `dtype` (on `device`), requiring grad."""
    return [None if t is None else t.detach().to(device=device, dtype=dtype).requires_grad_() for t in ts]


def run(fn: Callable, inputs: Sequence[torch.Tensor | None], cotangents: Sequence[torch.Tensor] | None):
    """(outputs, grads of Σ⟨output, cotangent⟩ w.r.t. the floating inputs)."""
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    if cotangents is None:
        gen = torch.Generator().manual_seed(7)
        cotangents = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device) for o in outs]
    loss = sum((o.double() * c).sum() for o, c in zip(outs, cotangents))
    wrt = [t for t in inputs if t is not None and t.requires_grad]
    return outs, torch.autograd.grad(loss, wrt), cotangents


def check_against_reference(
    name: str, triton_fn: Callable, ref_fn: Callable, inputs: Sequence, dtype, grad: bool = True, device=None
) -> None:
    """Triton path in `dtype` against the reference in float64 (both on `device`, default the
    inputs'): outputs and input gradients."""
    tri_in = leaves(*inputs, dtype=dtype, device=device)
    # the reference sees the same (rounded) input values
    ref_in = leaves(*tri_in, dtype=torch.float64)
    ref_out, ref_grads, cot = run(ref_fn, ref_in, None)
    tri_out, tri_grads, _ = run(triton_fn, tri_in, cot)
    tol = TOL[dtype]
    for i, (o, r) in enumerate(zip(tri_out, ref_out, strict=True)):
        assert o.dtype == dtype or o.dtype == torch.float32, f"{name} out{i} dtype {o.dtype}"
        assert_close(f"{name} out{i}", o, r, tol)
    if grad:
        for i, (g, r) in enumerate(zip(tri_grads, ref_grads, strict=True)):
            assert_close(f"{name} grad{i}", g, r, tol)
