"""The norms of blocks, final norms and q/k norms, built from a resolved `NormSpec`."""

from __future__ import annotations

import torch
from torch import nn

from lt2dsl.ir import nodes as n


class OffsetRMSNorm(nn.Module):
    """RMSNorm scaling by (1 + weight) (Gemma): x / sqrt(mean(x²) + eps) · (1 + w), over the last dim.

    Computed in fp32 (float64 for float64 inputs) and returned in the input dtype; `weight` `[dim]`
    starts at zero, so a fresh norm is the identity scale. x `[..., dim]` → `[..., dim]`.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(dt)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.to(dt))).to(x.dtype)


def make_norm(spec: n.NormSpec, dim: int) -> nn.Module:
    """`nn.RMSNorm` (weight), `OffsetRMSNorm` (weight, `offset`) or `nn.LayerNorm` (weight, bias)
    over the last dim with the spec's eps."""
    if spec.type == "layernorm":
        return nn.LayerNorm(dim, eps=spec.eps)
    if spec.offset:
        return OffsetRMSNorm(dim, eps=spec.eps)
    return nn.RMSNorm(dim, eps=spec.eps)
