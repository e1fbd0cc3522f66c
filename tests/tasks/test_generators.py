"""Every generator: its docstring example exactly, exact answers recomputed from the inputs by an
independent rule, determinism in (seed, step, split), and its preconditions as ValueErrors."""

from __future__ import annotations

import doctest
import importlib
import itertools

import numpy as np
import pytest

from lt2dsl.tasks import IGNORE
from lt2dsl.tasks.copy import copy
from lt2dsl.tasks.mqar import mqar
from lt2dsl.tasks.niah import NEEDLE, QUERY, niah
from lt2dsl.tasks.selective_copy import BLANK, GO, selective_copy
from lt2dsl.tasks.state_tracking import state_tracking

MODULES = ["state_tracking", "mqar", "copy", "selective_copy", "niah"]
SEED = [7, 3]  # an entropy list, as TaskSource passes


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_are_exact(name):
    mod = importlib.import_module(f"lt2dsl.tasks.{name}")
    result = doctest.testmod(mod)  # no option flags: the rows must match character for character
    assert result.attempted >= 1 and result.failed == 0


def compose(perms: list[tuple[int, ...]], a: int, b: int) -> int:
    """Id of "a then b", from the permutations themselves (not the generator's table)."""
    pa, pb = perms[a], perms[b]
    return perms.index(tuple(pb[pa[i]] for i in range(len(pa))))


@pytest.mark.parametrize("group, degree", [("parity", 2), ("s3", 3), ("s5", 5)])
def test_state_tracking_labels_are_running_products(group, degree):
    d = state_tracking(batch_size=6, seed=SEED, group=group, length=40)
    perms = sorted(itertools.permutations(range(degree)))
    assert d.inputs.max() < len(perms) and (d.labels != IGNORE).all()
    for row in range(6):
        p = d.inputs[row, 0]
        for t in range(40):
            if t:
                p = compose(perms, p, d.inputs[row, t])
            assert d.labels[row, t] == p
    last = state_tracking(batch_size=6, seed=SEED, group=group, length=40, answers="last")
    assert (last.labels[:, :-1] == IGNORE).all() and (last.labels[:, -1] == d.labels[:, -1]).all()


def test_parity_is_the_prefix_sum_mod_2():
    d = state_tracking(batch_size=32, seed=SEED, group="parity", length=64)
    assert (d.labels == np.cumsum(d.inputs, axis=1) % 2).all()


def test_mqar_answers_are_the_bound_values():
    N, V = 8, 64
    d = mqar(batch_size=16, seed=SEED, vocab=V, length=64, num_kv_pairs=N)
    for ids, labels in zip(d.inputs, d.labels):
        keys, values = ids[0 : 2 * N : 2], ids[1 : 2 * N : 2]
        assert (
            len(set(keys)) == N and (keys >= 1).all() and (keys < V // 2).all() and (values >= V // 2).all()
        )
        at = np.flatnonzero(labels != IGNORE)
        assert len(at) == N and (at >= 2 * N).all() and ((at - 2 * N) % 2 == 0).all()
        bound = dict(zip(keys, values))
        assert sorted(ids[at]) == sorted(keys)  # each key is queried once
        for t in at:
            assert labels[t] == bound[ids[t]] and ids[t + 1] == labels[t]
        assert (d.slices["distance"] >= 0).all()


def test_mqar_power_law_puts_queries_early():
    d = mqar(batch_size=256, seed=SEED, vocab=256, length=512, num_kv_pairs=4, power_a=0.01)
    at = np.flatnonzero((d.labels != IGNORE).ravel()) % 512
    assert np.median(at) < (8 + 512) / 2 - 100  # uniform slots would put the median near the middle


def test_copy_answers_repeat_the_string():
    n = 37
    d = copy(batch_size=5, seed=SEED, length=n, vocab=9)
    assert d.inputs.shape == (5, 2 * n) and (d.inputs[:, n] == 0).all()
    assert (d.labels[:, :n] == IGNORE).all() and (d.labels[:, n:] == d.inputs[:, :n]).all()
    assert (d.inputs[:, n + 1 :] == d.inputs[:, : n - 1]).all() and (d.inputs[:, :n] >= 1).all()


def test_selective_copy_answers_are_the_symbols_in_order():
    L, M = 50, 6
    d = selective_copy(batch_size=8, seed=SEED, context=L, num_tokens=M, vocab=12)
    for ids, labels in zip(d.inputs, d.labels):
        symbols = ids[:L][ids[:L] != BLANK]
        assert len(symbols) == M and (symbols >= 2).all() and ids[L] == GO
        assert (labels[:L] == IGNORE).all() and (labels[L:] == symbols).all()
        assert (ids[L + 1 :] == symbols[:-1]).all()


@pytest.mark.parametrize("needles", [1, 5])
def test_niah_answer_is_the_queried_needles_value(needles):
    K, V, ctx = 2, 3, 200
    d = niah(batch_size=8, seed=SEED, context=ctx, num_needles=needles, key_len=K, value_len=V, vocab=50)
    for ids, labels, depth in zip(d.inputs, d.labels, d.slices["depth"]):
        q = int(np.flatnonzero(ids == QUERY)[-1])
        key = tuple(ids[q + 1 : q + 1 + K])
        starts = np.flatnonzero(ids[:q] == NEEDLE)
        stored = {tuple(ids[s + 1 : s + 1 + K]): ids[s + 1 + K : s + 1 + K + V] for s in starts}
        assert len(starts) == needles and len(stored) == needles and key in stored
        assert (labels[: q + K] == IGNORE).all() and (labels[q + K :] == stored[key]).all()
        start = next(s for s in starts if tuple(ids[s + 1 : s + 1 + K]) == key)
        assert depth[0] == min(10 * start // (ctx + 1 - (1 + K + V)), 9)


@pytest.mark.parametrize("queries", [2, 4])
def test_niah_queries_each_ask_a_distinct_needle_and_label_its_value(queries):
    K, V, ctx, N = 2, 3, 240, 4
    d = niah(batch_size=8, seed=SEED, context=ctx, num_needles=N, key_len=K, value_len=V, vocab=50,
             num_queries=queries)  # fmt: skip
    H = ctx + 1 - queries * (1 + K + V)
    for ids, labels, depth in zip(d.inputs, d.labels, d.slices["depth"]):
        qs = np.flatnonzero(ids == QUERY)
        assert list(qs) == [H + i * (1 + K + V) for i in range(queries)]
        starts = np.flatnonzero(ids[:H] == NEEDLE)
        stored = {tuple(ids[s + 1 : s + 1 + K]): s for s in starts}
        asked = [tuple(ids[q + 1 : q + 1 + K]) for q in qs]
        assert len(starts) == N and len(set(asked)) == queries and set(asked) <= set(stored)
        assert (labels != IGNORE).sum() == queries * V
        for q, key in zip(qs, asked):
            s = stored[key]
            assert (labels[q + K : q + K + V] == ids[s + 1 + K : s + 1 + K + V]).all()
            assert (depth[q : q + 1 + K + V] == min(10 * s // H, 9)).all()


GENERATORS = {
    "state_tracking": lambda s: state_tracking(batch_size=4, seed=s, group="s5", length=32),
    "mqar": lambda s: mqar(batch_size=4, seed=s, vocab=64, length=64, num_kv_pairs=8),
    "copy": lambda s: copy(batch_size=4, seed=s, length=16),
    "selective_copy": lambda s: selective_copy(batch_size=4, seed=s, context=32, num_tokens=4),
    "niah": lambda s: niah(batch_size=4, seed=s, context=128, num_needles=2),
}


@pytest.mark.parametrize("name", GENERATORS)
def test_generators_are_pure_functions_of_the_seed(name):
    gen = GENERATORS[name]
    a, b, c = gen([0, 5]), gen([0, 5]), gen([0, 6])
    assert (a.inputs == b.inputs).all() and (a.labels == b.labels).all()
    assert all((a.slices[k] == b.slices[k]).all() for k in a.slices)
    assert not (a.inputs == c.inputs).all()
    assert a.inputs.dtype == a.labels.dtype == np.int64 and a.inputs.shape == a.labels.shape


BAD = [
    (state_tracking, dict(group="s4")),
    (state_tracking, dict(length=0)),
    (mqar, dict(vocab=16, num_kv_pairs=8)),
    (mqar, dict(length=20, num_kv_pairs=8)),
    (copy, dict(vocab=1)),
    (selective_copy, dict(context=3, num_tokens=4)),
    (niah, dict(context=10, num_needles=2)),
    (niah, dict(context=128, num_needles=2, num_queries=3)),
]


@pytest.mark.parametrize("fn, kw", BAD, ids=[f"{f.__name__}-{k}" for f, k in BAD])
def test_preconditions_raise_value_errors(fn, kw):
    with pytest.raises(ValueError):
        fn(batch_size=2, seed=0, **kw)
    with pytest.raises(ValueError, match="batch_size"):
        fn(batch_size=0, seed=0)
