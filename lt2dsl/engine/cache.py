"""Static decode caches: every (iteration, block) tensor allocated once, at its final size.

`StaticCache.allocate(model, B, max_len)` reads each mixer's layout from its spec
(`LayerSpec.cache(opts, cfg, B, max_len)`), so `nbytes()` is the estimate's state + KV bytes at
L = max_len and nothing is allocated afterwards. A cache has two faces:

* the cache itself decodes: `position()` gives `Positions` over `positions [B]` (int64 on the
  device, the tokens each row has seen), each row writes its one new token at its own position, and
  readers take whole buffers with per-row lengths — no host value enters a step, so the step can be
  captured as a CUDA graph;
* `rows(a, b)` is a view of rows a..b−1 that prefills them: its position is a host int shared by
  those rows (they hold prompts of one length), growing tensors are written at [seen, seen + T)
  and read back as their filled part, through the same kernels as a dynamic cache.

A sliding window keeps a ring of min(w, max_len) slots: position p lives in slot p mod R.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from lt2dsl.engine.positions import Positions
from lt2dsl.engine.sparse import compress_rows, toeplitz_rows
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup
from lt2dsl.kernels.common.backend import pick_backend
from lt2dsl.lowering.cache import Cache, StaticEntry
from lt2dsl.lowering.functional_sparse import check_tmm_length, compress_blocks, n_blocks, toeplitz_continue


def executed_blocks(stages) -> Iterator[n.Block]:
    """The blocks of `stages` in execution order, a loop's body once per iteration: the order of
    the model's cache entries (`to_fx.Unrolled.stages`)."""
    for s in stages:
        if isinstance(s, n.LoopBlock):
            for _ in range(s.T):
                yield from executed_blocks(s.body)
        else:
            yield s


def entry_layouts(model, batch_size: int, max_len: int) -> list[dict[str, tuple[tuple, torch.dtype]]]:
    """Per application: name → (shape, torch dtype) of the spec's cache layout at L = max_len.

    Recurrent states take the mixer's state dtype; conv buffers, KV and cached inputs the
    activation dtype (the lowering's contract, `layers/base.py`). A `par` block's mixer j names
    its tensors `"<j>.<name>"`.
    """
    index = {b.block_id: b for b in model.blocks}
    act = model.embed.weight.dtype
    out = []
    for block in executed_blocks(model.ir.body):
        module, names = index[block.id], {}
        for j, mixer in enumerate(block.mixers):
            prefix = f"{j}." if len(block.mixers) > 1 else ""
            state = module.mixers[j].state_dtype()
            for name, t in lookup(mixer.type).cache(mixer.opts, model.config, batch_size, max_len).items():
                names[prefix + name] = (t.shape, state if t.dtype == "state" else act)
        out.append(names)
    return out


class Cursor:
    """Where a static cache's rows stand, shared by the cache and its entries: `positions [B]` on
    the device; for a prefill view (`decoding` false) also `seen`, the host position of its rows.

    Entries read the cursor, never the cache, so a cache owns its entries without a reference
    cycle: dropping it frees every tensor at once, not at the next cyclic garbage collection."""

    __slots__ = ("decoding", "positions", "seen")

    def __init__(self, positions: torch.Tensor, decoding: bool):
        self.positions, self.decoding, self.seen = positions, decoding, 0


class Slots(StaticEntry):
    """The entry of one application in a `StaticCache`: its tensors, written in place."""

    def __init__(self, cursor: Cursor, tensors: dict[str, torch.Tensor]):
        super().__init__(reserve=None)
        self.cursor = cursor
        for k, t in tensors.items():
            dict.__setitem__(self, k, t)

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self[key].copy_(value)

    def sub(self, j: int) -> Slots:
        """Mixer j's names of a `par` block, over the same tensors."""
        p = f"{j}."
        return Slots(self.cursor, {k[len(p) :]: t for k, t in self.items() if k.startswith(p)})

    def append(self, key: str, new: torch.Tensor, dim: int, keep: int | None) -> torch.Tensor:
        buf, c = self[key], self.cursor
        if c.decoding:
            return _write_rows(buf, c.positions, new, dim, keep is not None)
        if keep is None:
            buf.narrow(dim, c.seen, new.shape[dim]).copy_(new)
            return buf.narrow(dim, 0, c.seen + new.shape[dim])
        return _append_ring(buf, c.seen, new, dim)

    def compress(
        self, x: torch.Tensor, key: str, cmp_block: int, stride: int, phi: tuple, backend: str = "reference"
    ) -> torch.Tensor:
        buf, c = self[key], self.cursor
        if c.decoding and pick_backend(backend, x) == "triton":
            from lt2dsl.kernels.nsa.triton_decode import compress_step  # imports Triton

            return compress_step((buf,), (x,), c.positions, cmp_block, stride, (phi,))[0]
        if c.decoding:
            return compress_rows(buf, x, c.positions, cmp_block, stride, phi)
        old, now = n_blocks(c.seen, cmp_block, stride), n_blocks(x.shape[1], cmp_block, stride)
        if now > old:
            blocks = x[:, old * stride :].unfold(1, cmp_block, stride)[:, : now - old].transpose(-1, -2)
            buf[:, :, old:now] = compress_blocks(blocks, *phi).transpose(1, 2)
        return buf[:, :, :now].transpose(1, 2)

    def compress_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        cmp_block: int,
        stride: int,
        phis: tuple,
        backend: str = "reference",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cursor
        if c.decoding and pick_backend(backend, k) == "triton":
            from lt2dsl.kernels.nsa.triton_decode import compress_step  # imports Triton

            bufs = (self["k_cmp"], self["v_cmp"])
            return compress_step(bufs, (k, v), c.positions, cmp_block, stride, phis)
        return super().compress_kv(k, v, cmp_block, stride, phis, backend)

    def toeplitz(self, u: torch.Tensor, w, bias, max_len: int, backend: str) -> torch.Tensor:
        buf, c = self["x"], self.cursor
        if c.decoding:
            return toeplitz_rows(_write_rows(buf, c.positions, u, 1, False), c.positions, w, bias, u.dtype)
        seen, T = c.seen, u.shape[1]
        check_tmm_length(seen, T, max_len)
        buf[:, seen : seen + T] = u
        return toeplitz_continue(u, buf[:, : seen + T], seen, w, bias, backend)


def _write_rows(buf: torch.Tensor, positions: torch.Tensor, new: torch.Tensor, dim: int, ring: bool):
    """Write each row's one new token `new` (size 1 along `dim`) at its position (its slot in a
    ring); the whole buffer back."""
    slot = torch.remainder(positions, buf.shape[dim]) if ring else positions
    index = slot.view(-1, *([1] * (new.dim() - 1))).expand_as(new)
    return buf.scatter_(dim, index, new.to(buf.dtype))


def _append_ring(buf: torch.Tensor, seen: int, new: torch.Tensor, dim: int) -> torch.Tensor:
    """A prefill chunk into a ring of R slots: the previous window in order followed by `new` (what
    the chunk's queries see), storing the last R positions at their slots."""
    R, T, dev = buf.shape[dim], new.shape[dim], buf.device
    lo = max(0, seen - R)
    full = torch.cat([buf.index_select(dim, torch.arange(lo, seen, device=dev) % R), new.to(buf.dtype)], dim)
    first = max(lo, seen + T - R)
    kept = torch.arange(first, seen + T, device=dev)
    buf.index_copy_(dim, kept % R, full.narrow(dim, first - lo, seen + T - first))
    return full


class StaticCache(Cache):
    """A decode cache allocated once for `batch_size` rows of up to `max_len` tokens each.

    `positions [B]` (int64, on the device) counts the tokens each row has seen. The cache itself
    decodes one token per row per call (`decoding`); `rows(a, b)` prefills a group of rows.
    """

    decoding = True

    def __init__(self, batch_size: int, max_len: int, positions: torch.Tensor):
        self.cursor = Cursor(positions, self.decoding)
        super().__init__(0, batch_size, max_len)
        self.max_len = max_len
        self.positions = positions
        self.step_positions = Positions(positions, max_len)

    @property
    def seen(self) -> int:
        return self.cursor.seen

    @seen.setter
    def seen(self, value: int) -> None:
        self.cursor.seen = value

    @classmethod
    def allocate(cls, model, batch_size: int, max_len: int) -> StaticCache:
        """Zeroed tensors of every application's layout at L = max_len, on the model's device."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
        dev = model.embed.weight.device
        # plain tensors even when called under inference mode: steps outside it write into them
        with torch.inference_mode(False):
            layouts = entry_layouts(model, batch_size, max_len)
            cache = cls(batch_size, max_len, torch.zeros(batch_size, dtype=torch.long, device=dev))
            cache.entries = [
                Slots(cache.cursor, {k: torch.zeros(s, dtype=dt, device=dev) for k, (s, dt) in lay.items()})
                for lay in layouts
            ]
        return cache

    def position(self):
        return self.step_positions.fresh() if self.decoding else self.seen

    def advance(self, T: int) -> None:
        self.positions.add_(T)
        if not self.decoding:
            self.seen += int(T)

    def rows(self, a: int, b: int) -> StaticCache:
        """A prefill view of rows a..b−1 (same memory), starting at position 0."""
        view = _RowView(b - a, self.max_len, self.positions[a:b])
        view.entries = [Slots(view.cursor, {k: t[a:b] for k, t in e.items()}) for e in self.entries]
        return view

    def reset(self) -> None:
        """Zero every tensor and position: a fresh cache without reallocating (masked slots are
        zeros, never stale non-finite values)."""
        for t in self.tensors():
            t.zero_()
        self.positions.zero_()
        self.seen = 0

    def __repr__(self) -> str:
        return self._repr("StaticCache", max_len=self.max_len)


class _RowView(StaticCache):
    """Rows of a `StaticCache` being prefilled: a host position shared by the rows."""

    decoding = False
