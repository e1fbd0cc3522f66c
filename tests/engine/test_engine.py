"""`Engine` / `LT2Model.generate`: tokens against the eager path, batching, sampling, stops, streams."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.engine import Engine, StaticCache, engine_for, stream

from ..lowering.util import KINDS, call, lower, tokens
from .util import (
    FLOOR,
    RATIO,
    RESOLVABLE,
    assert_near_the_truth,
    eager_greedy,
    greedy_pairs,
    relative,
    same,
    static_logits,
    truth_logits,
)

HYBRID = f"loop T=2 < {call('gdn')}; {call('swa')}; {call('dsa')} >"


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_equal_the_eager_path(kind):
    """Toy size, every kind inside a loop: generate's tokens are the eager path's (prefill, then
    `model(tok, cache)` per token through a dynamic cache)."""
    model = lower(f"loop T=2 < {call(kind)}; full >")
    ids = tokens(2, 5)
    assert torch.equal(model.generate(ids, 7), eager_greedy(model, ids, 7))


def test_a_batch_of_different_lengths_gives_each_prompt_its_tokens_alone():
    """Prompts of lengths 5, 2, 7 in one call, in a 4-row bucket (a padding row), with a chunked
    prefill: each row's tokens are those the prompt gets alone and those of the eager path."""
    model = lower(HYBRID, fuse=True)
    engine = Engine(model, buckets=(4,), prefill_chunk=3)
    ids = tokens(3, 7)
    prompts = [ids[0, :5], ids[1, :2], ids[2, :7]]
    together = engine.generate(prompts, 6)
    assert engine.slots[4].cache.batch_size == 4
    for p, got in zip(prompts, together):
        assert torch.equal(got, engine.generate([p], 6)[0])
        assert torch.equal(got, eager_greedy(model, p[None], 6)[0])
    assert [len(t) for t in together] == [11, 8, 13]
    lists = engine.generate([p.tolist() for p in prompts], 6)  # lists of ids work the same
    assert all(torch.equal(a, b) for a, b in zip(lists, together))


def test_the_gpu_comparisons_on_the_cpu(monkeypatch):
    """`test_gpu`'s checks with both engines eager: one engine's calls (its slot replaced by a longer
    call, then reused) give bitwise the tokens of another's and of a fresh engine's, each prompt
    alone in the same bucket gives its row of the pair, and both caches' logits are as near the
    float64 truth as one forward. Steps that stay at one position fail that check, and are farther
    from the truth than the largest bound it allows (`RATIO · RESOLVABLE + FLOOR`)."""
    model = lower(HYBRID)
    ids = tokens(2, 6)
    prompts = [ids[0], ids[1, :3]]
    calls = [(ids, 1), (prompts, 12), (ids, 1)]
    engine, runs = greedy_pairs(model, calls, buckets=(2,), granule=8)
    assert engine.slots[2].cache.max_len == 24
    assert all(same(got, want) for got, want in runs)
    assert all(same(got, Engine(model, buckets=(2,)).generate(p, n)) for (got, _), (p, n) in zip(runs, calls))
    for p, row in zip(prompts, runs[1][0]):
        assert torch.equal(row, engine.generate([p], 12)[0])
    seq = runs[1][0][0][None]
    errs = assert_near_the_truth(model, seq, 6)
    assert max(errs.values()) <= 1e-9
    advance = StaticCache.advance
    monkeypatch.setattr(StaticCache, "advance", lambda c, T: advance(c, 0 if c.decoding else T))
    with pytest.raises(AssertionError, match="cache logits from the truth"):
        assert_near_the_truth(model, seq, 6)
    assert relative(static_logits(model, seq, 6), truth_logits(model, seq, 6)) > RATIO * RESOLVABLE + FLOOR


def test_same_seed_same_tokens_and_temperature_zero_is_deterministic():
    model = lower(HYBRID)
    ids = tokens(2, 4)
    kw = dict(temperature=1.3, top_k=20, top_p=0.9)
    a = model.generate(ids, 8, seed=3, **kw)
    assert torch.equal(a, model.generate(ids, 8, seed=3, **kw))
    assert not torch.equal(a, model.generate(ids, 8, seed=4, **kw))
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    first = model.generate(ids, 8, generator=g1, **kw)
    assert torch.equal(first, model.generate(ids, 8, generator=g2, **kw))
    # a generator advances: its next call samples other tokens
    assert not torch.equal(first, model.generate(ids, 8, generator=g1, **kw))
    greedy = model.generate(ids, 8)
    assert torch.equal(greedy, model.generate(ids, 8)) and torch.equal(greedy, eager_greedy(model, ids, 8))


def test_stop_tokens_end_rows_and_max_new_tokens_bounds_them():
    model = lower(HYBRID)
    ids = tokens(3, 4)
    free = model.generate(ids, 10)
    assert free.shape == (3, 14)
    stop = int(free[0, 6])  # row 0's third new token
    out = model.generate(ids, 10, stop_tokens=[stop], pad_token_id=1)
    for b in range(3):
        new, want = out[b, 4:].tolist(), free[b, 4:].tolist()
        end = want.index(stop) + 1 if stop in want else len(want)
        assert new[:end] == want[:end] and all(t == 1 for t in new[end:])
    ragged = model.generate(list(ids), 10, stop_tokens=stop)
    for b, t in enumerate(ragged):
        want = free[b, 4:].tolist()
        end = want.index(stop) + 1 if stop in want else len(want)
        assert t.tolist() == ids[b].tolist() + want[:end]
    every = model.generate(ids, 10, stop_tokens=sorted(set(free[:, 4].tolist())))
    assert every.shape == (3, 5)  # every row stops at its first token: nothing more is returned
    assert model.generate(ids, 0).shape == (3, 4)


def test_stream_yields_one_column_per_step():
    model = lower(HYBRID)
    ids = tokens(2, 4)
    cols = [c.clone() for c in stream(model, ids, 6)]
    assert len(cols) == 6 and all(c.shape == (2,) for c in cols)
    assert torch.equal(torch.cat([ids, torch.stack(cols, dim=1)], dim=1), model.generate(ids, 6))
    assert model.training  # restored once the stream ends


def test_the_engine_follows_the_model_when_it_moves():
    model = lower(HYBRID)
    ids = tokens(1, 4)
    engine = engine_for(model)
    before = model.generate(ids, 5)
    slot = engine.slots[1]
    model.float()
    assert model.generate(ids, 5).dtype == torch.long and engine.slots[1] is not slot
    assert engine.slots[1].cache.entries[0]["state"].dtype == torch.float32
    model.double()
    assert torch.equal(model.generate(ids, 5), before)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(stop_tokens=64), "stop_tokens"),
        (dict(stop_tokens=[-1]), "stop_tokens"),
        (dict(stop_tokens=list(range(17))), "at most 16"),
        (dict(pad_token_id=[1, 2]), "pad_token_id"),
        (dict(seed=-1), "seed"),
        (dict(generator=3), "generator"),
        (dict(max_new_tokens=True), "max_new_tokens"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(input_ids=[]), "input_ids"),
        (dict(input_ids=[[1, 2], []]), "prompt 1"),
        (dict(input_ids=[[1, 2.5]]), "prompt 0"),
        (dict(input_ids=[[1, 99]]), "token ids must be in"),
        (dict(input_ids=torch.zeros(2, 3)), "integer dtype"),
    ],
)
def test_generate_rejects_bad_arguments_before_running(kwargs, match):
    model = lower(call("gdn"))
    args = dict(input_ids=tokens(1, 3), max_new_tokens=2) | kwargs
    with pytest.raises(ValueError, match=match):
        model.generate(**args)
    assert not engine_for(model).slots  # nothing was allocated or run


def test_tmm_refuses_a_request_past_its_max_len_up_front():
    model = lower(call("tmm"))  # max_len=32
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    with pytest.raises(ValueError, match=r"run 33 tokens.*max_len=32"):
        model.generate([list(range(20)), list(range(30))], 4, temperature=1.0, generator=g)
    assert not engine_for(model).slots and torch.equal(g.get_state(), state)
    assert [len(t) for t in model.generate([list(range(20)), list(range(30))], 3)] == [23, 33]


def test_engine_arguments_are_checked():
    model = lower(call("gdn"))
    with pytest.raises(ValueError, match="prefill_chunk"):
        Engine(model, prefill_chunk=0)
    with pytest.raises(ValueError, match="capture=True needs"):
        Engine(model, capture=True)
    with pytest.raises(ValueError, match="head"):
        lower(call("gdn"), head="none").generate(tokens(1, 2), 1)
