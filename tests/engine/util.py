"""Shared helpers of the engine tests: the eager reference paths and a no-host-sync check."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lt2dsl.engine import Engine, StaticCache
from lt2dsl.engine.step import decode_one, prefill

# aten ops that read a device value back to the host or whose output shape depends on data: a
# captured step can contain none of them
# relative distance of bf16 static-cache logits from the dynamic cache's: two roundings of the same
# sums (a wrong position, mask or state gives distances of order one)
BF16_TOL = 0.05

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


def dynamic_logits(model, seq: torch.Tensor, T: int) -> torch.Tensor:
    """Teacher-forced along `seq [B, N]` through a dynamic cache: a prefill of its first T tokens,
    then one token per call; the logits that predict tokens T..N−1, `[B, N − T, vocab]`."""
    cache = model.new_cache(seq.shape[0])
    with torch.no_grad():
        out = [model(seq[:, :T], cache)[:, -1]]
        out += [model(seq[:, i : i + 1], cache)[:, -1] for i in range(T, seq.shape[1] - 1)]
    return torch.stack(out, dim=1)


def static_logits(model, seq: torch.Tensor, T: int, chunk: int = 2048) -> torch.Tensor:
    """`dynamic_logits` through the engine's code: a `StaticCache`, a chunked prefill of the rows,
    then `decode_one` per token."""
    B = seq.shape[0]
    cache = StaticCache.allocate(model, B, seq.shape[1])
    with torch.no_grad():
        out = [prefill(model, seq[:, :T], cache.rows(0, B), chunk)]
        out += [decode_one(model, seq[:, i : i + 1], cache) for i in range(T, seq.shape[1] - 1)]
    return torch.stack(out, dim=1)


def assert_near_the_dynamic_path(model, seq: torch.Tensor, T: int, tol: float) -> float:
    """The static and dynamic caches' logits along `seq` (a prompt of T tokens and what followed)
    differ by at most `tol` relative to the logits (Frobenius norms); the relative error."""
    static, dynamic = static_logits(model, seq, T).double(), dynamic_logits(model, seq, T).double()
    err = float((static - dynamic).norm() / dynamic.norm())
    assert err <= tol, f"static-cache logits {err:.3g} (relative) from the dynamic cache's, above {tol}"
    return err


def greedy_pairs(model, calls, **kw) -> tuple[Engine, list[tuple]]:
    """Each greedy call `(prompts, n)` through the model's engine (captured on CUDA) and through
    `Engine(model, capture=False)` (the same static-cache code run eagerly), both making the same
    calls in the same order: the first engine and (its tokens, the eager engine's) per call."""
    captured, eager = Engine(model, **kw), Engine(model, capture=False, **kw)
    return captured, [(captured.generate(p, n), eager.generate(p, n)) for p, n in calls]


def same(a, b) -> bool:
    """Bitwise equal tokens: tensors, or lists of 1-D tensors."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
