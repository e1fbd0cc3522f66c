"""Shared helpers of the engine tests: the eager reference path and a no-host-sync check."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that read a device value back to the host or whose output shape depends on data: a
# captured step can contain none of them
HOST_SYNC = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item"}


class NoHostSync(TorchDispatchMode):
    """Raise AssertionError on any op of `HOST_SYNC` run inside the block."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in HOST_SYNC:
            raise AssertionError(f"host sync in a decode step: {func}")
        return func(*args, **(kwargs or {}))


def jitter(model, scale: float = 0.05, seed: int = 0):
    """Add noise to every parameter, so parameters initialised to zero (biases, tmm's position
    bias, NSA's block embedding) take part in what a test compares."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def eager_greedy(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """The eager path: one prefill then `model(tok, cache)` per token through a dynamic cache."""
    cache = model.new_cache(ids.shape[0])
    out = [ids]
    with torch.no_grad():
        logits = model(ids, cache)
        for i in range(n):
            out.append(logits[:, -1].argmax(-1, keepdim=True))
            if i + 1 < n:
                logits = model(out[-1], cache)
    return torch.cat(out, dim=1)
