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


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
@pytest.mark.parametrize("kind", KINDS)
def test_looped_decode_equals_one_forward(kind, schedule):
    model = lower(f"loop T=2 < {call(kind)}; full >")
    ids = tokens(2, sum(schedule))
    with torch.no_grad():
        whole = model(ids)
        pieces, cache = run_chunks(model, ids, schedule)
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
