"""L2 normalisation of q / k heads, shared by the delta-rule ops and the fused conv kernels' reference."""

from __future__ import annotations

import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(Σx² + eps) over the last dim, in fp32 (float64 stays float64), back to x's dtype."""
    xf = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)
