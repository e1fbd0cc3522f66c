"""The PyTorch form of `xent`: what the Triton kernel computes, in the wide dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """Loss and gradient dtype: fp32, float64 for float64 logits (exact tests)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def xent_reference(logits: torch.Tensor, labels: torch.Tensor, grads: bool):
    """logits `[n, V]`, labels `[n]` (IGNORE: no loss, zero gradient): the summed cross-entropy and,
    with `grads`, softmax − one-hot at the labelled rows, 0 at the others, both in the wide dtype."""
    x = logits.to(wide_dtype(logits.dtype))
    loss = F.cross_entropy(x, labels, ignore_index=IGNORE, reduction="sum")
    if not grads:
        return loss, None
    g = torch.softmax(x, dim=-1)
    # no boolean indexing, whose shapes the host would have to read (a CUDA graph captures this)
    valid = (labels != IGNORE)[:, None]
    g.scatter_add_(1, labels.clamp(min=0)[:, None], -valid.to(g.dtype))
    g.masked_fill_(~valid, 0.0)
    return loss, g
