"""Cross-entropy over rows of logits with its gradient in one pass (the chunked LM loss's inner
step, `lt2dsl.train.loss`): `xent` picks the Triton kernel (`triton_xent`) or the PyTorch form
(`naive`) by backend."""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.backend import resolve_backend

from .naive import IGNORE, xent_reference
from .triton_xent import xent_triton

__all__ = ["IGNORE", "xent", "xent_reference", "xent_triton"]


def xent(logits: torch.Tensor, labels: torch.Tensor, grads: bool, backend: str = "auto"):
    """(Σ over labelled rows of −log softmax(logits)[label] as a 0-d fp32 tensor (float64 for
    float64 logits), d(loss)/d(logits) or None): see `xent_reference`. "auto" is the kernel on
    CUDA for fp32/bf16/fp16 logits (the gradient then in the logits' dtype, written over them),
    the reference elsewhere; float64 always takes the reference."""
    if logits.dtype == torch.float64 and backend == "auto":
        backend = "reference"
    if resolve_backend(backend, logits) == "triton":
        return xent_triton(logits, labels, grads)
    return xent_reference(logits, labels, grads)
