"""Decode equivalence (issue 3): every kind inside `loop T=2 < KIND; full >`, float64.

A prefill of n tokens followed by m single-token steps (and a multi-token continuation) through
one cache gives the logits of one forward over all n + m tokens: each (iteration, block) owns its
cache entry, so the looped model decodes exactly.
"""

from __future__ import annotations

import pytest
import torch

from .util import KINDS, call, lower, run_chunks, tokens

SCHEDULES = {"prefill7+5x1": [7, 1, 1, 1, 1, 1], "5+3+4x1": [5, 3, 1, 1, 1, 1]}


@pytest.mark.parametrize("reserve", [None, 9, 64], ids=["exact", "reserve-short", "reserved"])
@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
@pytest.mark.parametrize("kind", KINDS)
def test_looped_decode_equals_one_forward(kind, schedule, reserve):
    """Also through caches with a reserve (in-place KV writes), one of them outgrown mid-way."""
    model = lower(f"loop T=2 < {call(kind)}; full >")
    ids = tokens(2, sum(schedule))
    with torch.no_grad():
        whole = model(ids)
        pieces, cache = run_chunks(model, ids, schedule, reserve)
    assert torch.isfinite(whole).all()
    torch.testing.assert_close(pieces, whole, rtol=1e-9, atol=1e-9)
    assert cache.seen == ids.shape[1]
    # Four applications, (iteration, block) in execution order, all filled.
    assert len(cache.entries) == 4 and all(len(e) for e in cache.entries)


def test_decode_does_not_depend_on_other_rows_of_the_batch():
    model = lower(f"loop T=2 < {call('gdn')}; {call('swa')} >")
    ids = tokens(3, 9)
    with torch.no_grad():
        batch, _ = run_chunks(model, ids, [4, 1, 1, 1, 1, 1])
        alone, _ = run_chunks(model, ids[1:2], [4, 1, 1, 1, 1, 1])
    torch.testing.assert_close(batch[1:2], alone, rtol=1e-10, atol=1e-10)


def test_cache_entries_are_distinct_per_iteration():
    """The same block's two iterations see different inputs, so their states differ."""
    model = lower(f"loop T=2 < {call('gdn')} >")
    cache = model.new_cache(1)
    with torch.no_grad():
        model(tokens(1, 6), cache)
    first, second = (e["state"] for e in cache.entries)
    assert first.shape == second.shape and not torch.allclose(first, second)


def test_reserved_cache_is_written_in_place():
    """With max_len, decode steps neither copy nor reallocate the KV cache, and nbytes counts the
    reserve: the estimate's KV bytes at L = max_len."""
    model = lower(f"loop T=2 < {call('gdn')}; full >")
    ids = tokens(1, 12)
    cache = model.new_cache(1, max_len=40)
    with torch.no_grad():
        model(ids[:, :8], cache)
        ptrs = [e["k"].untyped_storage().data_ptr() for e in cache.entries if "k" in e]
        held = cache.nbytes()
        for t in range(8, 12):
            model(ids[:, t : t + 1], cache)
    assert ptrs and [e["k"].untyped_storage().data_ptr() for e in cache.entries if "k" in e] == ptrs
    assert cache.nbytes() == held and all(e["k"].shape[2] == 12 for e in cache.entries if "k" in e)
    exact = model.new_cache(1)
    with torch.no_grad():
        model(tokens(1, 40), exact)
    assert held == exact.nbytes()  # the reserve is exactly a 40-token cache


def test_reserved_cache_under_autograd_falls_back_to_copies():
    """In-place writes would break a graph that saved the cache: with gradients the cache copies,
    also when only q needs them (attention saves k and v for q's gradient)."""
    model = lower("full; full")
    for name, p in model.named_parameters():
        p.requires_grad_("q_proj" in name)
    ids = tokens(1, 6)
    cache = model.new_cache(1, max_len=16)
    out = torch.cat([model(ids[:, :4], cache), model(ids[:, 4:5], cache), model(ids[:, 5:], cache)], 1)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_reserved_cache_mixed_with_grad_and_inference_mode_calls():
    """A grad-enabled call in between copies the cache; the next no-grad call must not write into
    the stale reserved buffer. A buffer made under inference_mode is replaced outside it."""
    model = lower(f"{call('full')}; full")
    ids = tokens(1, 8)
    with torch.no_grad():
        whole = model(ids)
    cache = model.new_cache(1, max_len=16)
    with torch.inference_mode():
        outs = [model(ids[:, :4], cache).clone()]
    with torch.no_grad():
        outs.append(model(ids[:, 4:5], cache))
    outs.append(model(ids[:, 5:6], cache).detach())
    with torch.no_grad():
        outs += [model(ids[:, 6:7], cache), model(ids[:, 7:8], cache)]
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=1e-9, atol=1e-9)


def test_cache_bytes_follow_tokens_in_a_fused_model():
    """Fused projections return views of one GEMM's output: the cache keeps copies of its slices,
    so nbytes() counts the cached tokens only, on a real device (the estimate agreement runs on
    meta, which has no storages to tell apart)."""
    model = lower(f"{call('gdn')}; full", fuse=True)
    cache = model.new_cache(1)
    with torch.no_grad():
        model(tokens(1, 6), cache)
        after6 = cache.nbytes()
        model(tokens(1, 1), cache)
    assert cache.nbytes() - after6 == 2 * 2 * 16 * 8  # k and v of one token: HKV·d float64 each
    k = next(e["k"] for e in cache.entries if "k" in e)
    assert k.untyped_storage().nbytes() == k.numel() * k.element_size()


@pytest.mark.parametrize(
    "body", ["full; full(kv_heads=1)", "par(full, full(kv_heads=1))", call("dsa"), call("nsa")]
)
def test_triton_decode_through_reserved_caches(body):
    """backend="triton", fp32: decode steps hand the attention kernels strided views of reserved
    buffers (read in place, not copied), outgrown mid-way; same logits as one forward."""
    model = lower(f"loop T=2 < {body} >", dtype=torch.float32, backend="triton")
    ids = tokens(1, 11)
    with torch.no_grad():
        whole = model(ids)
        pieces, cache = run_chunks(model, ids, [6, 1, 1, 1, 1, 1], max_len=9)
    torch.testing.assert_close(pieces, whole, rtol=1e-4, atol=1e-4)
    assert cache.seen == 11


def test_compiled_decode_through_a_reserved_cache():
    """torch.compile(fullgraph=True) traces the reserved-cache path (no storage-pointer or
    inference-mode queries in it) and decodes as one forward does."""
    model = lower(f"{call('gdn')}; full", dtype=torch.float32)
    ids = tokens(1, 8)
    with torch.no_grad():
        whole = model(ids)
        gm = torch.compile(model.graph_module, fullgraph=True, backend="aot_eager")
        cache = model.new_cache(1, max_len=16)
        outs = [gm(ids[:, :5], cache)] + [gm(ids[:, t : t + 1], cache) for t in range(5, 8)]
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=1e-5, atol=1e-5)
    assert all(e["k"].shape[2] == 8 for e in cache.entries if "k" in e) and cache.nbytes() > 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_triton_backend_decode_equals_one_forward(kind):
    """backend="triton" (fp32) for every kind in a loop: a prefill that crosses the 64-token chunk
    boundary, then single-token steps through a reserved cache, against one forward."""
    n = 26 if kind == "tmm" else 66  # tmm's tiny kernel length is 32
    model = lower(f"loop T=2 < {call(kind)} >", dtype=torch.float32, backend="triton")
    ids = tokens(1, n + 4)
    with torch.no_grad():
        whole = model(ids)
        pieces, _ = run_chunks(model, ids, [n, 1, 1, 1, 1], max_len=n + 4)
    err = (pieces - whole).abs().max() / whole.abs().max()
    assert torch.isfinite(pieces).all() and err < 1e-5, f"{kind}: relative max error {err:.2e}"
