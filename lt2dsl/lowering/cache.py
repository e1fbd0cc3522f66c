"""Decode caches: one `Entry` per (iteration, block) application, owned by a `Cache`.

An entry is a dict of tensors keyed by the names of the layer spec's `cache()` layout (e.g.
`state`, `q_conv`, `k`, `v`). Entries start empty and are filled by the first call (prefill);
growing caches (KV, index keys, tmm inputs) hold exactly the tokens seen so far, so
`Cache.nbytes()` after a prefill of L tokens equals the estimate's `state_bytes + kv_bytes`.

A cache made with `reserve=n` (`LT2Model.new_cache(B, max_len=n)`; `generate` does this) allocates
each growing KV tensor for n tokens at once and writes new tokens in place, so a decode step
neither copies the cache nor reallocates it; `entry[key]` is then a view of the filled part and
`nbytes()` counts the reserved buffers (the estimate's KV bytes at L = n).

Static caches (`lt2dsl.engine`) hold every tensor of the layout at its final size from the start.
The leaves meet them through the two contracts at the end of this file: a `StaticEntry` writes in
place, and `RowPositions`, which such a cache gives as `pos` for a decode step, carries one
position per row and computes the ops that depend on it.
"""

from __future__ import annotations

import torch


class Entry(dict):
    """Cache tensors of one (iteration, block) application; a par block keys its mixers' tensors
    by `"<mixer index>.<name>"` through `sub(j)`. `buffers` holds the reserved storage behind
    growing tensors that are views (see the module docstring), as (buffer, made under inference
    mode); `reserve` its token count."""

    def __init__(self, reserve: int | None = None):
        super().__init__()
        self.reserve = reserve
        self.buffers: dict[str, tuple[torch.Tensor, bool]] = {}

    def sub(self, j: int) -> SubEntry:
        return SubEntry(self, f"{j}.")

    def clear(self) -> None:
        super().clear()
        self.buffers.clear()


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

    @property
    def reserve(self) -> int | None:
        return self.parent.reserve

    @property
    def buffers(self) -> _PrefixedBuffers:
        return _PrefixedBuffers(self.parent.buffers, self.prefix)


class _PrefixedBuffers:
    """`Entry.buffers` seen through a `SubEntry`'s prefix."""

    def __init__(self, buffers: dict, prefix: str):
        self.buffers, self.prefix = buffers, prefix

    def get(self, k: str):
        return self.buffers.get(self.prefix + k)

    def pop(self, k: str, default=None):
        return self.buffers.pop(self.prefix + k, default)

    def __setitem__(self, k: str, v: tuple[torch.Tensor, bool]) -> None:
        self.buffers[self.prefix + k] = v


class Cache:
    """All decode state of one batch of sequences for an `LT2Model`.

    `seen` counts the tokens processed so far (the position of the next token). Each call of the
    model with a cache advances it by the call's length.
    """

    def __init__(self, n_entries: int, batch_size: int, reserve: int | None = None):
        self.entries = [Entry(reserve) for _ in range(n_entries)]
        self.batch_size = batch_size
        self.seen = 0

    def entry(self, k: int) -> Entry:
        return self.entries[k]

    def position(self):
        """`pos` of the next call's first token: an int shared by every row (`RowPositions` for a
        static cache's decode step)."""
        return self.seen

    def advance(self, T: int) -> None:
        """Count the T tokens of a call as seen (after every block has run)."""
        self.seen += int(T)

    def tensors(self):
        for e in self.entries:
            yield from e.values()

    def nbytes(self) -> int:
        """Bytes held by the cache: every tensor, and a reserved buffer whole (once)."""
        total = 0
        for e in self.entries:
            held = {
                b.untyped_storage().data_ptr(): b.numel() * b.element_size() for b, _ in e.buffers.values()
            }
            counted = set()
            for t in e.values():
                ptr = t.untyped_storage().data_ptr()
                if ptr and ptr in held:
                    if ptr not in counted:
                        counted.add(ptr)
                        total += held[ptr]
                else:
                    total += t.numel() * t.element_size()
        return total

    def reset(self) -> None:
        for e in self.entries:
            e.clear()
        self.seen = 0

    def __repr__(self) -> str:
        return self._repr("Cache", seen=self.seen)

    def _repr(self, name: str, **middle) -> str:
        """`name(entries=…, batch=…, <middle>, nbytes=…)`, the form every cache class prints."""
        fields = {"entries": len(self.entries), "batch": self.batch_size, **middle, "nbytes": self.nbytes()}
        return f"{name}({', '.join(f'{k}={v}' for k, v in fields.items())})"


class StaticEntry(Entry):
    """An entry allocated once at its final size: every name of the spec's `cache()` layout is
    present from the start, and `entry[name] = t` copies t into that tensor in place (so a
    leaf that replaces a state or a conv history writes into the same memory every step).

    Leaves whose tensors grow with the sequence call these methods instead of growing them.
    """

    def append(self, key: str, new: torch.Tensor, dim: int, keep: int | None) -> torch.Tensor:
        """`append_cache` into the fixed buffer (`keep`: the window of a ring buffer)."""
        raise NotImplementedError

    def compress(
        self, x: torch.Tensor, key: str, cmp_block: int, stride: int, phi: tuple, backend: str = "reference"
    ) -> torch.Tensor:
        """`nsa_compress` into the fixed buffer of compressed blocks."""
        raise NotImplementedError

    def compress_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        cmp_block: int,
        stride: int,
        phis: tuple,
        backend: str = "reference",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`compress` of the keys into "k_cmp" and of the values into "v_cmp" (phis: their φ)."""
        return (
            self.compress(k, "k_cmp", cmp_block, stride, phis[0], backend),
            self.compress(v, "v_cmp", cmp_block, stride, phis[1], backend),
        )

    def toeplitz(self, u: torch.Tensor, w, bias, max_len: int, backend: str) -> torch.Tensor:
        """`toeplitz_cached` over the fixed buffer of mixer inputs."""
        raise NotImplementedError


class RowPositions:
    """Positions of one decode step through a static cache: one per row (`[B]` on the device,
    the new token's position), so rows of different lengths decode together and the step holds no
    Python-int position. The leaves pass the ops that depend on positions to it."""

    def rows(self) -> torch.Tensor:
        """`[B]` int64 on the device: each row's position, where its new token is written."""
        raise NotImplementedError

    def rope_rows(self, d: int, theta: float, dtype: torch.dtype, scaling=None) -> tuple:
        """(c, s) `[B, d]`: `functional.rope_rows` at each row's position (`scaling`:
        `rope_scaling.py`), which `apply_rope` turns each row's new token by."""
        raise NotImplementedError

    def xpos(self, xs: tuple, backend: str) -> tuple:
        """`xpos_rotate` of each x `[B, 1, H, K]` (one K) at each row's position, with the kernel
        backend `backend` (`kernels.fused.xpos`: one launch for all of them)."""
        raise NotImplementedError

    def attention(self, q, k, v, window: int | None, gate, backend: str) -> torch.Tensor:
        """`attention_core` of q `[B, 1, HQ, d]` over the static KV buffers k, v `[B, L, HKV, d]`."""
        raise NotImplementedError

    def dsa(
        self, q, k, v, q_idx, k_idx, w_idx, topk: int, idx_scale: float, backend: str, w_scale: float = 1.0
    ) -> torch.Tensor:
        """`dsa_attend` over the static buffers (each row's keys up to its position), the indexer
        weights `w_idx · w_scale`."""
        raise NotImplementedError

    def nsa(self, q, k, v, g, k_cmp, v_cmp, geometry: dict, backend: str) -> torch.Tensor:
        """`nsa_attend` over the static buffers (each row's keys up to its position); g the gates'
        logits."""
        raise NotImplementedError
