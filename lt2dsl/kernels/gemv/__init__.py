"""Decode GEMV: a projection of a few rows (the decode batch, M ≤ 16) with its neighbours fused.

`gemv(x, W, ...)` is `F.linear(x, W)` with an optional RMSNorm prologue and a SwiGLU or
residual-add epilogue, one Triton launch (`triton_gemv.py`) that streams W once; the unfused chain
(`naive.gemv_ref`) runs wherever the kernel does not apply. It has no backward: the FX rule that
calls it (`lowering/fx_passes/decode_gemv.py`) uses it in the static-cache decode step only.

| call | replaces | launches |
|---|---|---|
| `gemv(x, W)` | `F.linear(x, W)` | 1 |
| `gemv(x, W, norm_weight=γ, eps=ε)` | `F.rms_norm(x, γ, ε)`, `F.linear` | 1 |
| `gemv(x, W_gu, up=F, width=F[, norm_weight=γ])` | (norm,) `F.linear`, split, `silu(g) · u` | 1 |
| `gemv(x, W, residual=r)` | `F.linear`, `r + y` | 1 |
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.backend import resolve_backend

from .naive import gemv_ref

__all__ = ["MAX_M", "gemv", "gemv_applies", "gemv_ref"]

MAX_M = 16  # the decode rows one launch takes (`triton_gemv.BM`)
_DTYPES = (torch.bfloat16, torch.float16)


def gemv_applies(
    x: torch.Tensor, weight: torch.Tensor, *others: torch.Tensor | None, backend: str = "auto"
) -> bool:
    """Whether `gemv` runs its kernel: Triton for these tensors, 1 ≤ M ≤ 16 rows, 16-bit x and W of
    one dtype with unit column strides, no autograd to record."""
    M = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
    if not 1 <= M <= MAX_M or x.dtype not in _DTYPES or weight.dtype != x.dtype or weight.dim() != 2:
        return False
    if weight.shape[1] != x.shape[-1] or weight.stride(-1) != 1 or x.stride(-1) != 1:
        return False
    tensors = (x, weight, *others)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return False
    return resolve_backend(backend, x) == "triton"


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float | None = None,
    residual: torch.Tensor | None = None,
    up: int | None = None,
    width: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """`[..., K]` → `[..., N]`: f(x) @ Wᵀ, one launch for M = x.numel() / K ≤ 16 rows.

    Args:
        x: `[..., K]` the decode rows; weight `[N_w, K]` (a projection's, or a concatenation's).
        norm_weight, eps: RMSNorm · γ over K before the product (None eps: x's dtype eps).
        residual: `[..., N_w]`, added to the product (the residual stream of a block).
        up, width: SwiGLU: gate rows `[0, width)`, up rows `[up, up + width)` of W → `[..., width]`
            silu(gate) · up. Default width: `up`.
    Returns:
        `[..., N]` in x's dtype (N = width with `up`, else N_w); the unfused chain's values up to
        bf16 rounding.
    """
    if up is not None:
        width = up if width is None else width
        if not (0 < width <= up and up + width <= weight.shape[0]) or residual is not None:
            rows = weight.shape[0]
            raise ValueError(f"gemv: SwiGLU needs 0 < width <= up, up + width <= {rows}, no residual")
    kw = {"norm_weight": norm_weight, "eps": eps, "residual": residual, "up": up, "width": width}
    N = width if up is not None else weight.shape[0]
    lead = x.shape[:-1]
    ok = gemv_applies(x, weight, norm_weight, residual, backend=backend)
    if ok and residual is not None:
        ok = residual.shape == (*lead, N) and residual.dtype == x.dtype and residual.stride(-1) == 1
    if ok and norm_weight is not None:
        ok = norm_weight.shape == x.shape[-1:]
    if not ok:
        return gemv_ref(x, weight, **kw)
    from .triton_gemv import gemv_fwd

    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    out = torch.empty(x2.shape[0], N, dtype=x.dtype, device=x.device)
    r2 = residual.reshape(-1, N) if residual is not None else None
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    gemv_fwd(x2, weight, out, norm_weight=norm_weight, eps=eps, residual=r2, up=up)
    return out.view(*lead, N)
