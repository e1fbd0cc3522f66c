"""Decode caches: one `Entry` per (iteration, block) application, owned by a `Cache`.

An entry is a dict of tensors keyed by the names of the layer spec's `cache()` layout (e.g.
`state`, `q_conv`, `k`, `v`). Entries start empty and are filled by the first call (prefill);
growing caches (KV, index keys, tmm inputs) hold exactly the tokens seen so far, so
`Cache.nbytes()` after a prefill of L tokens equals the estimate's `state_bytes + kv_bytes`.
"""

from __future__ import annotations

import torch


class Entry(dict):
    """Cache tensors of one (iteration, block) application; a par block keys its mixers' tensors
    by `"<mixer index>.<name>"` through `sub(j)`."""

    def sub(self, j: int) -> SubEntry:
        return SubEntry(self, f"{j}.")


class SubEntry:
    """A prefixed view of an `Entry`, so each mixer of a `par` block sees its own names."""

    def __init__(self, parent: Entry, prefix: str):
        self.parent, self.prefix = parent, prefix

    def __contains__(self, k: str) -> bool:
        return self.prefix + k in self.parent

    def __getitem__(self, k: str) -> torch.Tensor:
        return self.parent[self.prefix + k]

    def __setitem__(self, k: str, v: torch.Tensor) -> None:
        self.parent[self.prefix + k] = v

    def get(self, k: str, default=None):
        return self.parent.get(self.prefix + k, default)


class Cache:
    """All decode state of one batch of sequences for an `LT2Model`.

    `seen` counts the tokens processed so far (the position of the next token). Each call of the
    model with a cache advances it by the call's length.
    """

    def __init__(self, n_entries: int, batch_size: int):
        self.entries = [Entry() for _ in range(n_entries)]
        self.batch_size = batch_size
        self.seen = 0

    def entry(self, k: int) -> Entry:
        return self.entries[k]

    def tensors(self):
        for e in self.entries:
            yield from e.values()

    def nbytes(self) -> int:
        """Bytes held by every cache tensor."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def reset(self) -> None:
        for e in self.entries:
            e.clear()
        self.seen = 0

    def __repr__(self) -> str:
        return (f"Cache(entries={len(self.entries)}, batch={self.batch_size}, seen={self.seen}, "
                f"nbytes={self.nbytes()})")
