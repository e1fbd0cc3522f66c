"""Comparison helpers for kernel tests: relative RMS error against a float64 reference."""

from __future__ import annotations

import torch


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ computed in float64; NaN/Inf anywhere gives inf (never passes)."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out).all():
        return float("inf")
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else num


def assert_close(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    """Assert relative RMS error ≤ tol; returns the error."""
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    err = rel_rms(out, ref)
    max_abs = (out.detach().double().cpu() - ref.detach().double().cpu()).abs().max().item()
    assert err <= tol, f"{name}: relative RMS error {err:.3e} > {tol:.1e} (max abs {max_abs:.3e})"
    return err


def seeded_like(t: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """Standard normal noise shaped and typed like t, from its own generator: an upstream gradient
    that does not depend on which tests ran before in the same process (with `randn_like`, a bf16
    case near its tolerance passed or failed with the xdist test order)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t.shape, generator=g, dtype=torch.float32).to(device=t.device, dtype=t.dtype)


# Where the small-shape Triton tests run: compiled on the GPU when there is one, else under the
# CPU interpreter (TRITON_INTERPRET=1, set by tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
