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
| `gemv(o, W, norm_weight=γ, gate=z, group=G[, residual=r])` | gated RMSNorm, `F.linear`(, `r + y`) | 1 |
| `norm_add_gemv(r, y, γ₁, ε₁, W, γ₂, ε₂[, up=F])` | `norm_add_rmsnorm` (sandwich), `F.linear`(, SwiGLU) | 1 |
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.backend import resolve_backend

from .naive import gemv_ref, norm_add_gemv_ref

__all__ = ["MAX_M", "gemv", "gemv_applies", "gemv_ref", "groups_fit", "norm_add_gemv", "norm_add_gemv_ref"]

MAX_M = 16  # the decode rows one launch takes (`triton_gemv.BM`)
MAX_GROUP = 512  # the largest group of a gated norm (`triton_gemv.MAX_GROUP`: the largest K tile)
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
    gate: torch.Tensor | None = None,
    group: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """`[..., K]` → `[..., N]`: f(x) @ Wᵀ, one launch for M = x.numel() / K ≤ 16 rows.

    Args:
        x: `[..., K]` the decode rows; weight `[N_w, K]` (a projection's, or a concatenation's).
        norm_weight, eps: RMSNorm · γ over K before the product (None eps: x's dtype eps).
        residual: `[..., N_w]`, added to the product (the residual stream of a block).
        up, width: SwiGLU: gate rows `[0, width)`, up rows `[up, up + width)` of W → `[..., width]`
            silu(gate) · up. Default width: `up`.
        gate, group: `[..., K]` and an int: the norm is fla's gated RMSNorm (GDN's output norm) over
            each group of `group` channels, · γ (`[dim]`, repeated over K), · silu(gate).
    Returns:
        `[..., N]` in x's dtype (N = width with `up`, else N_w); the unfused chain's values up to
        bf16 rounding.
    """
    width = _swiglu_width(weight, up, width, residual)
    if gate is not None and (norm_weight is None or group is None):
        raise ValueError("gemv: a gated norm needs norm_weight and group")
    kw = {"norm_weight": norm_weight, "eps": eps, "residual": residual, "up": up, "width": width}
    kw |= {"gate": gate, "group": group}
    N = width if up is not None else weight.shape[0]
    lead = x.shape[:-1]
    ok = gemv_applies(x, weight, norm_weight, residual, gate, backend=backend)
    if ok and residual is not None:
        ok = _rows_like(residual, x, N)
    if ok and gate is not None:
        ok = _rows_like(gate, x, x.shape[-1]) and groups_fit(x.shape[-1], norm_weight.shape[0], group)
    elif ok and norm_weight is not None:
        ok = norm_weight.shape == x.shape[-1:]
    if not ok:
        return gemv_ref(x, weight, **kw)
    from .triton_gemv import gemv_fwd

    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    out = torch.empty(x2.shape[0], N, dtype=x.dtype, device=x.device)
    r2 = residual.reshape(-1, N) if residual is not None else None
    gated = (gate.reshape(-1, K), group) if gate is not None else None
    gemv_fwd(x2, weight, out, norm_weight=norm_weight, eps=_eps(eps, x), residual=r2, up=up, gated=gated)
    return out.view(*lead, N)


def norm_add_gemv(
    res: torch.Tensor,
    y: torch.Tensor,
    w1: torch.Tensor,
    eps1: float | None,
    weight: torch.Tensor,
    w2: torch.Tensor,
    eps2: float | None,
    *,
    up: int | None = None,
    width: int | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sandwich block's residual add-norm and the projection of its normed sum, one launch:
    s = res + RMSNorm(y) · γ₁, (s, gemv(RMSNorm(s) · γ₂, W[, up, width])).

    Args:
        res, y: `[..., K]` the residual stream and the branch output; w1, w2 `[K]`; weight `[N_w, K]`.
        up, width: the SwiGLU epilogue, as `gemv`'s.
    Returns:
        (s `[..., K]`, out `[..., N]`) in y's dtype, the unfused chain's values up to bf16 rounding.
    """
    width = _swiglu_width(weight, up, width, None)
    N = width if up is not None else weight.shape[0]
    ok = gemv_applies(y, weight, res, w1, w2, backend=backend) and _rows_like(res, y, y.shape[-1])
    if not ok or w1.shape != y.shape[-1:] or w2.shape != y.shape[-1:]:
        return norm_add_gemv_ref(res, y, w1, eps1, weight, w2, eps2, up=up, width=width)
    from .triton_gemv import gemv_fwd

    K = y.shape[-1]
    y2, r2 = y.reshape(-1, K), res.reshape(-1, K)
    s = torch.empty(y2.shape, dtype=y.dtype, device=y.device)
    out = torch.empty(y2.shape[0], N, dtype=y.dtype, device=y.device)
    gemv_fwd(y2, weight, out, norm_weight=w2, eps=_eps(eps2, y), up=up, sandwich=(r2, w1, _eps(eps1, y), s))
    return s.view(y.shape), out.view(*y.shape[:-1], N)


def _swiglu_width(weight: torch.Tensor, up: int | None, width: int | None, residual) -> int | None:
    """The SwiGLU's width (default: `up`), checked against the weight's rows."""
    if up is None:
        return width
    width = up if width is None else width
    if not (0 < width <= up and up + width <= weight.shape[0]) or residual is not None:
        rows = weight.shape[0]
        raise ValueError(f"gemv: SwiGLU needs 0 < width <= up, up + width <= {rows}, no residual")
    return width


def _rows_like(t: torch.Tensor, x: torch.Tensor, n: int) -> bool:
    """t is `[*x.shape[:-1], n]` in x's dtype with a unit column stride (the kernel's second input)."""
    return t.shape == (*x.shape[:-1], n) and t.dtype == x.dtype and t.stride(-1) == 1


def groups_fit(K: int, dim: int, group: int) -> bool:
    """The gated norm's groups tile the kernel's K tiles: group a power of two ≤ MAX_GROUP dividing
    γ's length dim, which divides K."""
    return 0 < group <= MAX_GROUP and group & (group - 1) == 0 and dim % group == 0 and K % dim == 0


def _eps(eps: float | None, x: torch.Tensor) -> float:
    return torch.finfo(x.dtype).eps if eps is None else eps
