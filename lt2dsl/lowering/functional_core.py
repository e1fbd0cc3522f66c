"""Leaf functions of the lowered model graph: cache plumbing and the softmax-attention core.

Each is wrapped with `torch.fx.wrap`, so the traced graph records one call node per use (with the
cache as an argument) instead of tracing into code that branches on whether a cache exists.
`cache_advance` is also marked side-effecting, so dead-code elimination never drops it.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.node import has_side_effect

from lt2dsl.lowering.cache import Cache, Entry, SubEntry


@torch.fx.wrap
def cache_entry(cache: Cache | None, k: int) -> Entry | None:
    """The entry of application k ((iteration, block) pairs counted in execution order), or None."""
    return None if cache is None else cache.entry(k)


@torch.fx.wrap
def sub_entry(entry: Entry | None, j: int) -> SubEntry | None:
    """Mixer j's view of a `par` block's entry, or None without a cache."""
    return None if entry is None else entry.sub(j)


@torch.fx.wrap
def cache_pos(cache: Cache | None) -> int:
    """Absolute position of the first token of this call: tokens seen so far (0 without a cache)."""
    return 0 if cache is None else cache.seen


@has_side_effect
@torch.fx.wrap
def cache_advance(cache: Cache | None, T: int) -> None:
    """Count the T tokens of this call as seen (called once, after every block has run)."""
    if cache is not None:
        cache.seen += int(T)


@torch.fx.wrap
def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int | None,
    gate: torch.Tensor | None,
    backend: str,
) -> torch.Tensor:
    """Causal softmax attention through `lt2dsl.kernels.attention` (one graph node).

    Args:
        q: `[B, Tq, HQ, d]` rotated queries; they are the last Tq positions of the keys.
        k, v: `[B, Tk, HKV, d]` rotated keys / values (cached ones first).
        window: sliding window w (keys including the query's own), or None for full attention.
        gate: pre-sigmoid output gate `[B, Tq, HQ, d]` or `[B, Tq, HQ]`, or None.
        backend: "reference", "triton" or "auto".
    Returns:
        `[B, Tq, HQ, d]` in the dtype of `v`.
    """
    # From the op's subpackage: `lt2dsl.kernels.attention` is the subpackage once imported.
    from lt2dsl.kernels.attention import attention

    return attention(q, k, v, causal=True, window=window, gate=gate, backend=backend)
