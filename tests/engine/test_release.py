"""An engine's caches are freed by reference counting alone: `release()`, dropping the engine, a
slot replaced by a longer call and a finished stream each free every cache tensor at once, with the
cyclic garbage collector off (on CUDA a cache left for the collector crowds out the next one)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from lt2dsl.cost.hardware import load_hardware
from lt2dsl.engine import Engine, StaticCache, bench

from ..lowering.util import call, lower, tokens

HYBRID = f"loop T=2 < {call('gdn')}; {call('swa')}; {call('dsa')} >"


@pytest.fixture
def no_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def cache_refs(engine: Engine) -> list[weakref.ref]:
    """Weak references to every tensor of every slot's cache (and its positions)."""
    refs = []
    for slot in engine.slots.values():
        refs += [weakref.ref(t) for t in slot.cache.tensors()]
        refs.append(weakref.ref(slot.cache.positions))
    return refs


def used(engine: Engine) -> list[weakref.ref]:
    """Two buckets, ragged prompts (prefill through row views) and a stream run to its end."""
    engine.generate(tokens(2, 5), 4)
    prompts = list(tokens(3, 6))
    engine.generate([prompts[0][:6], prompts[1][:2], prompts[2][:4]], 3)
    assert len(list(engine.stream(tokens(3, 4), 3))) == 3
    assert sorted(engine.slots) == [2, 3]
    return cache_refs(engine)


def alive(refs: list[weakref.ref]) -> int:
    return sum(r() is not None for r in refs)


def test_release_frees_every_cache_tensor(no_gc):
    model = lower(HYBRID)  # the engine holds its model weakly
    engine = Engine(model)
    refs = used(engine)
    assert alive(refs) == len(refs)
    engine.release()
    assert alive(refs) == 0


def test_dropping_the_engine_frees_every_cache_tensor(no_gc):
    model = lower(HYBRID)
    engine = Engine(model)
    refs = used(engine)
    del engine
    assert alive(refs) == 0


def test_a_slot_replaced_by_a_longer_call_is_freed_before_its_successor_is_allocated(no_gc, monkeypatch):
    model = lower(HYBRID)
    engine = Engine(model, granule=8)
    engine.generate(tokens(1, 4), 2)
    refs = cache_refs(engine)
    alive_at_allocation = []
    allocate = StaticCache.allocate.__func__

    def watched(cls, *args):
        alive_at_allocation.append(alive(refs))
        return allocate(cls, *args)

    monkeypatch.setattr(StaticCache, "allocate", classmethod(watched))
    engine.generate(tokens(1, 4), 20)  # 23 tokens: the 8-token cache is replaced
    assert engine.slots[1].cache.max_len == 24
    assert alive_at_allocation == [0]
    assert alive(refs) == 0


def test_bench_frees_each_bucket_before_the_next_one_even_after_an_oom(no_gc, monkeypatch):
    """`bench.run`: when a batch size starts, no cache of an earlier batch size is alive, whether
    that batch's last point finished or ran out of memory."""
    model = lower(HYBRID)
    real, earlier, seen = bench.measure, {}, []

    def measure(engine, batch, ctx, plan, step_bytes):
        seen.append((batch, ctx, sum(alive(refs) for b, refs in earlier.items() if b != batch)))
        out = real(engine, batch, ctx, plan, step_bytes)
        earlier.setdefault(batch, []).extend(cache_refs(engine))
        if batch == 2 and ctx == 16:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return out

    monkeypatch.setattr(bench, "measure", measure)
    plan = bench.Plan((8, 16), (1, 2, 3), 1, 0, load_hardware("h100"))
    rows = bench.run([("toy", model)], plan)
    assert [(r["batch"], r["ctx"]) for r in rows if r.get("oom")] == [(2, 16)]
    assert seen == [(b, L, 0) for b in (1, 2, 3) for L in (8, 16)]
    assert all(alive(refs) == 0 for refs in earlier.values())


def test_built_models_are_freed_before_the_next_is_built(no_gc):
    """`bench.run` given builders builds each model at its turn and drops it after its points, by
    reference counting alone: when the second is built the first's weights are gone (on CUDA they
    would crowd its points and fake an out-of-memory against the estimate's largest batch)."""
    refs, seen = [], []

    def builder():
        seen.append([r() is None for r in refs])
        model = lower(HYBRID, dtype=torch.float32)
        refs.append(weakref.ref(model.embed.weight))
        return model

    plan = bench.Plan((8,), (1,), 1, 0, load_hardware("h100"))
    rows = bench.run([("a", builder), ("b", builder)], plan)
    assert [r["model"] for r in rows] == ["a", "b"] and all(r["tok_s"] > 0 for r in rows)
    assert seen == [[], [True]] and refs[1]() is None
