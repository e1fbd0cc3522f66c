"""The static cache (`lt2dsl/engine/cache.py`) against the lowering's own forward, every kind.

Rows of different lengths prefill through row views in chunks, then decode together, one token per
row at each row's own position: every step's logits equal one forward over that row's tokens so
far (float64, so any difference is a wrong mask, slot or position, not rounding). The same steps
read no device value on the host and write only into the memory allocated at the start.
"""

from __future__ import annotations

import gc
import math
import warnings
from pathlib import Path

import pytest
import torch

import lt2dsl
from lt2dsl.cost.estimate import EstimateOptions, estimate
from lt2dsl.dtypes import Dtypes
from lt2dsl.engine import StaticCache
from lt2dsl.engine.step import decode_one, prefill

from ..lowering.util import KINDS, call, lower, tokens
from .util import NoHostSync, jitter

LENGTHS = (5, 3, 7)  # prompt length per row; windows (4), top-k (4) and NSA blocks are passed
STEPS = 4


def run_static(model, ids: torch.Tensor, cache: StaticCache, chunk: int = 2):
    """Prefill row b with LENGTHS[b] tokens (chunks of `chunk`), then STEPS steps of all rows;
    yields (step i, logits [B, vocab]) with each step run under `NoHostSync`."""
    for b, n in enumerate(LENGTHS):
        prefill(model, ids[b : b + 1, :n], cache.rows(b, b + 1), chunk)
    for i in range(STEPS):
        tok = torch.stack([ids[b, n + i] for b, n in enumerate(LENGTHS)])[:, None]
        with NoHostSync():
            logits = decode_one(model, tok, cache)
        yield i, logits


def assert_static_equals_forward(model, max_len: int, chunk: int = 2, tol: float = 1e-9) -> StaticCache:
    """`run_static`'s logits of every row and step against one forward over that row's tokens."""
    ids = tokens(len(LENGTHS), max(LENGTHS) + STEPS).to(next(model.parameters()).device)
    cache = StaticCache.allocate(model, len(LENGTHS), max_len)
    with torch.no_grad():
        for i, logits in run_static(model, ids, cache, chunk):
            for b, n in enumerate(LENGTHS):
                want = model(ids[b : b + 1, : n + i + 1])[0, -1]
                torch.testing.assert_close(logits[b], want, rtol=tol, atol=tol)
    return cache


def live_tensors() -> int:
    gc.collect()
    with warnings.catch_warnings():  # isinstance on deprecated torch module attributes warns
        warnings.simplefilter("ignore")
        return sum(isinstance(o, torch.Tensor) for o in gc.get_objects())


@pytest.mark.parametrize("kind", KINDS)
def test_static_decode_equals_one_forward_per_row(kind):
    cache = assert_static_equals_forward(jitter(lower(f"loop T=2 < {call(kind)}; full >")), max_len=16)
    assert cache.positions.tolist() == [n + STEPS for n in LENGTHS]


@pytest.mark.parametrize(
    "body",
    [
        "par(gdn(expand_v=1), swa(window=4)); full",
        "loop T=3, final_norm=true, exit=gate(threshold=0.5) < swa(window=4); mamba2(state=8, head_dim=16) >",
        "loop T=2, inject=concat < nsa(block=4, select=2, window=4, cmp_block=4, stride=2, kv_heads=1, "
        "compress=mlp); tmm(heads=2, kernel=2, max_len=32) >",
        "full(rope_dim=8, rope_scaling=llama3, rope_factor=8, rope_original_len=4, qkv_bias=true); "
        "swa(window=4, rope_scaling=linear, rope_factor=2)",
    ],
    ids=["par", "exit-gate", "nsa-mlp-tmm", "rope-scaling"],
)
def test_static_decode_of_par_blocks_and_loop_options(body):
    """`par` blocks (prefixed names), gated exits, concat injection, learned NSA compression, partial
    and scaled RoPE; fused graph (the fused conv and core leaves write the static entries too)."""
    assert_static_equals_forward(jitter(lower(body, fuse=True)).eval(), max_len=12, chunk=3)


def test_steps_write_only_into_the_cache_allocated_at_the_start():
    """Every cache tensor keeps its storage through the steps, and a step keeps no tensor alive
    once it returns (the live-tensor count after steps is the count after the first)."""
    model = lower(f"loop T=2 < {call('gdn')}; {call('swa')}; {call('dsa')} >", fuse=True)
    ids = tokens(len(LENGTHS), max(LENGTHS) + STEPS).to(next(model.parameters()).device)
    cache = StaticCache.allocate(model, len(LENGTHS), 16)
    with torch.no_grad():
        steps = run_static(model, ids, cache)
        next(steps)
        ptrs = [t.untyped_storage().data_ptr() for t in cache.tensors()]
        held = cache.nbytes()
        live = live_tensors()
        for _ in steps:
            pass
        assert live_tensors() <= live
    assert [t.untyped_storage().data_ptr() for t in cache.tensors()] == ptrs and cache.nbytes() == held


def test_row_views_share_memory_and_reset_zeroes():
    model = lower(f"{call('gdn')}; {call('swa')}")
    cache = StaticCache.allocate(model, 3, 8)
    view = cache.rows(1, 3)
    assert all(v.data_ptr() == t[1:3].data_ptr() for e, w in zip(cache.entries, view.entries) for t, v in
               zip(e.values(), w.values()))  # fmt: skip
    with torch.no_grad():
        prefill(model, tokens(2, 5), view, 2)
    assert cache.positions.tolist() == [0, 5, 5] and view.seen == 5
    assert any(bool(t.any()) for t in cache.tensors())
    cache.reset()
    assert not any(bool(t.any()) for t in cache.tensors()) and cache.positions.tolist() == [0, 0, 0]


@pytest.mark.parametrize("kind", KINDS)
def test_each_static_tensor_has_the_dtype_the_dynamic_cache_keeps_it_in(kind):
    """bf16, fused: after a prefill and a step, every tensor of the static cache has the dtype of
    the dynamic cache's tensor of that name, recurrent states fp32 (the estimate's state bytes),
    so neither path rounds a state the other keeps wider."""
    model = lower(f"{call(kind)}; full", dtype=torch.bfloat16, fuse=True)
    ids = tokens(1, 6)
    dynamic, static = model.new_cache(1), StaticCache.allocate(model, 1, 8)
    with torch.no_grad():
        model(ids[:, :5], dynamic)
        model(ids[:, 5:], dynamic)
        prefill(model, ids[:, :5], static.rows(0, 1), 2)
        decode_one(model, ids[:, 5:], static)
    for d, s in zip(dynamic.entries, static.entries):
        assert {k: t.dtype for k, t in s.items()} == {k: t.dtype for k, t in d.items()}
    states = [t for e in static.entries for t in e.values() if t.dtype != torch.bfloat16]
    assert all(t.dtype == torch.float32 for t in states)
    assert bool(states) == (kind not in ("full", "swa", "dsa", "nsa", "tmm"))


def test_assignment_writes_in_place():
    model = lower(call("gdn"))
    cache = StaticCache.allocate(model, 1, 4)
    entry = cache.entries[0]
    state = entry["state"]
    entry["state"] = torch.ones_like(state)
    assert entry["state"] is state and bool((state == 1).all())


EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.lt2"))


@pytest.mark.parametrize("path", [*EXAMPLES[:3], EXAMPLES[-1]], ids=lambda p: p.stem)
def test_static_cache_bytes_equal_the_estimate(path):
    """Allocated once at max_len, the cache holds exactly the estimate's state + KV bytes at
    L = max_len (on the meta device: shapes without memory)."""
    model = lt2dsl.compile(path, backend="reference", device="meta")
    B, L = 2, 4096 + 64
    cache = StaticCache.allocate(model, B, L)
    cfg = model.config
    dt = Dtypes(act=cfg.dtype, state=cfg.state_dtype, kv=cfg.dtype)
    mem = estimate(model.ir, EstimateOptions(seq=L, batch=B, dtypes=dt)).memory
    assert cache.nbytes() == mem.state_bytes + mem.kv_bytes
    assert len(cache.entries) == model.applications
    assert math.prod(cache.positions.shape) == B


def test_allocate_checks_its_arguments():
    model = lower(call("gdn"))
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="batch_size"):
            StaticCache.allocate(model, bad, 4)
        with pytest.raises(ValueError, match="max_len"):
            StaticCache.allocate(model, 1, bad)


@pytest.mark.slow
def test_static_decode_through_the_triton_kernels():
    """The same steps on the Triton kernels (the CPU interpreter in CI): flash-decoding over the
    static KV buffers and a window's ring, DSA's sparse attention on a given selection, the
    recurrent decode kernels updating state views in place."""
    body = f"{call('gdn')}; {call('swa')}; {call('dsa')}"
    model = jitter(lower(body, backend="triton", dtype=torch.float32))
    assert_static_equals_forward(model, max_len=12, chunk=4, tol=1e-4)
