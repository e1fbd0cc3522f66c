"""`Engine`: batched generation of one `LT2Model` through static caches and captured steps.

Per batch-size bucket the engine keeps a `Slot`: a `StaticCache` and the step's tensors (the
current token, the output columns, finished rows, stop tokens, a generator), all allocated once.
A call resets the slot, prefills each run of equal-length prompts through a row view of the cache,
samples the first token, then runs one step per token: on CUDA the replay of a graph captured once
per (bucket, sampling), on the CPU the same function eagerly. A step writes its token column into
the output buffer in place and touches nothing else, so steps allocate no memory.

Rows that meet a stop token emit `pad` from then on; the host looks at the finished rows every
`check_every` steps (one sync) and stops when all are done.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import torch

from lt2dsl.engine.cache import StaticCache
from lt2dsl.engine.request import MAX_STOPS, Request, check_request
from lt2dsl.engine.sampling import Sampling, sample
from lt2dsl.engine.step import Captured, decode_one, prefill


class Slot:
    """One bucket's static state: `rows` sequences of up to `max_len` tokens."""

    def __init__(self, model, rows: int, max_len: int):
        dev = model.embed.weight.device
        self.cache = StaticCache.allocate(model, rows, max_len)
        with torch.inference_mode(False):
            self.tok = torch.zeros(rows, 1, dtype=torch.long, device=dev)
            self.out = torch.zeros(rows, max_len + 1, dtype=torch.long, device=dev)
            self.index = torch.zeros(1, dtype=torch.long, device=dev)
            self.done = torch.zeros(rows, dtype=torch.bool, device=dev)
            self.stops = torch.full((MAX_STOPS,), -1, dtype=torch.long, device=dev)
            self.pad = torch.zeros((), dtype=torch.long, device=dev)
        self.generator = torch.Generator(device=dev)
        self.graphs: dict[Sampling, Captured] = {}
        # The slot's captured steps share one memory pool, which lives exactly as long as they do:
        # the allocator frees a pool once its last graph is gone, and a capture into a freed pool's
        # handle fails, so a pool is never shared with another slot (which may be replaced first).
        self.pool = None

    def reset(self, req: Request) -> None:
        """Fresh cache and step state for `req`, its stop tokens and its seed."""
        self.cache.reset()
        self.index.zero_()
        self.done.zero_()
        self.stops.fill_(-1)
        if req.stops:
            self.stops[: len(req.stops)] = torch.tensor(req.stops, device=self.stops.device)
        self.pad.fill_(req.pad)
        self.generator.manual_seed(req.seed)

    def accept(self, nxt: torch.Tensor) -> None:
        """Take the sampled tokens `[B]`: pad for finished rows, mark rows that stop, write the column."""
        nxt = torch.where(self.done, self.pad, nxt)
        self.done |= (nxt[:, None] == self.stops).any(dim=-1)
        self.tok.copy_(nxt[:, None])
        self.out.index_copy_(1, self.index, nxt[:, None])
        self.index.add_(1)


class Engine:
    """Generation for one model (its weights as they are; after `.to()` the engine starts over).

    Args:
        model (LT2Model): a lowered model with an LM head.
        prefill_chunk (int, Optional): longest prompt piece per model call. Default: `2048`.
        buckets (tuple, Optional): batch sizes the steps are made for; a batch runs in the smallest
            bucket that holds it (extra rows decode a one-token dummy prompt). Default: powers of two
            on CUDA, the batch itself on the CPU.
        capture (bool, Optional): capture each step as a CUDA graph. Default: on CUDA.
        granule (int, Optional): cache lengths are rounded up to a multiple of it, so calls of
            nearby lengths share a cache and its captured steps. Default: `64`.
        check_every (int, Optional): steps between looks at the finished rows. Default: `16`.
    """

    def __init__(self, model, *, prefill_chunk: int = 2048, buckets=None, capture=None, granule: int = 64,
                 check_every: int = 16):  # fmt: skip
        for name, v in (("prefill_chunk", prefill_chunk), ("granule", granule), ("check_every", check_every)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        cuda = model.embed.weight.device.type == "cuda"
        self._model = weakref.ref(model)
        self.prefill_chunk, self.granule, self.check_every = prefill_chunk, granule, check_every
        self.buckets = tuple(sorted(buckets)) if buckets else None
        self.capture = cuda if capture is None else bool(capture)
        if self.capture and not cuda:
            raise ValueError("capture=True needs the model on a CUDA device")
        self.slots: dict[int, Slot] = {}
        # the traced graph the slots were made for: `.to()` / new graph passes retrace it
        self._graph: weakref.ref | None = None

    @property
    def model(self):
        model = self._model()
        if model is None:
            raise ValueError("the engine's model no longer exists")
        return model

    # ---- the public calls -----------------------------------------------------------------------

    def generate(self, input_ids, max_new_tokens: int, **kw) -> torch.Tensor | list[torch.Tensor]:
        """Continue prompts; see `LT2Model.generate` for the arguments.

        Returns `[B, T + n]` for a `[B, T]` tensor (n ≤ max_new_tokens: up to the last row's stop
        token, finished rows padded), or for a list of prompts a list of 1-D tensors, each its
        prompt and its new tokens up to and including its stop token.
        """
        req = check_request(self.model, input_ids, max_new_tokens, **kw)
        B, steps = len(req.prompts), sum(1 for _ in self._run(req))
        if steps:
            new = self.slots[self.bucket(B)].out[:B, :steps].clone()
        else:
            new = req.prompts[0].new_zeros(B, 0)
        lengths = _lengths(new, req.stops)
        if req.ragged:
            return [torch.cat([p, new[b, : lengths[b]]]) for b, p in enumerate(req.prompts)]
        return torch.cat([torch.stack(req.prompts), new[:, : max(lengths, default=0)]], dim=1)

    def stream(self, input_ids, max_new_tokens: int, **kw) -> Iterator[torch.Tensor]:
        """One `[B]` column of new tokens per step (finished rows give `pad`). Each column is a view
        of the engine's output buffer, valid until the next call: clone it to keep it."""
        return self._run(check_request(self.model, input_ids, max_new_tokens, **kw))

    def release(self) -> None:
        """Free every cache and captured step."""
        self.slots.clear()

    # ---- running --------------------------------------------------------------------------------

    def _run(self, req: Request) -> Iterator[torch.Tensor]:
        if req.max_new_tokens == 0:
            return
        model, B = self.model, len(req.prompts)
        was_training = model.training
        model.eval()
        try:
            slot = self._slot(self.bucket(B), req.longest)
            step = self._step(slot, req)
            self._start(slot, req)
            yield slot.out[:B, 0]
            for i in range(1, req.max_new_tokens):
                if req.stops and i % self.check_every == 0 and bool(slot.done[:B].all()):
                    return
                with torch.no_grad():
                    step()
                yield slot.out[:B, i]
        finally:
            model.train(was_training)

    @torch.no_grad()
    def _start(self, slot: Slot, req: Request) -> None:
        """Reset, prefill every run of equal-length prompts, take the first token."""
        slot.reset(req)
        prompts = list(req.prompts) + [req.prompts[0].new_zeros(1)] * (
            slot.cache.batch_size - len(req.prompts)
        )
        logits, a = [], 0
        while a < len(prompts):
            b = a
            while b < len(prompts) and prompts[b].numel() == prompts[a].numel():
                b += 1
            ids = torch.stack(prompts[a:b])
            logits.append(prefill(self.model, ids, slot.cache.rows(a, b), self.prefill_chunk))
            a = b
        slot.accept(sample(torch.cat(logits), req.sampling, slot.generator))

    def _step(self, slot: Slot, req: Request):
        """The decode step of `slot` for `req`'s sampling: captured on CUDA, eager on the CPU."""
        model, s = self.model, req.sampling

        def step() -> None:
            slot.accept(sample(decode_one(model, slot.tok, slot.cache), s, slot.generator))

        if not self.capture:
            return step
        if s not in slot.graphs:
            with torch.no_grad():
                slot.reset(req)  # warm-up steps write at positions from 0
                if slot.pool is None:
                    slot.pool = torch.cuda.graph_pool_handle()
                gen = None if s.greedy else slot.generator
                slot.graphs[s] = Captured(step, generator=gen, pool=slot.pool)
        return slot.graphs[s]

    def _slot(self, rows: int, longest: int) -> Slot:
        """The bucket's slot, reallocated when its cache is too short or the model changed."""
        model = self.model
        gm = self._graph() if self._graph is not None else None
        if gm is not model.graph_module:
            self.release()
            self._graph = weakref.ref(model.graph_module)
        old = self.slots.get(rows)
        if old is not None and old.cache.max_len >= longest:
            return old
        del old  # the replaced slot's memory is free before its successor is allocated
        self.slots.pop(rows, None)
        cap = model.max_len if model.max_len is not None else float("inf")
        length = int(min(-(-max(longest, 1) // self.granule) * self.granule, cap))
        self.slots[rows] = Slot(model, rows, length)
        return self.slots[rows]

    def bucket(self, B: int) -> int:
        """The number of rows a batch of B runs in."""
        if self.buckets:
            return next((b for b in self.buckets if b >= B), B)
        if self.capture:
            return 1 << (B - 1).bit_length()
        return B


def _lengths(new: torch.Tensor, stops: tuple[int, ...]) -> list[int]:
    """New tokens per row: up to and including the first stop token, else all."""
    n = new.shape[1]
    if not stops or n == 0:
        return [n] * new.shape[0]
    hit = torch.isin(new, torch.tensor(stops, device=new.device))
    first = torch.where(hit.any(dim=1), hit.to(torch.int8).argmax(dim=1) + 1, n)
    return first.tolist()


_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def engine_for(model) -> Engine:
    """The model's default engine, made on first use and kept while the model lives."""
    engine = _ENGINES.get(model)
    if engine is None:
        engine = _ENGINES[model] = Engine(model)
    return engine
