"""The opt-in rule `l2_prefetch`: where it puts the prefetches (after each projection, the next
projection's weights; the last wraps to the first; one join before the output), that the graph's
results do not change, its byte budget, and on a GPU the engine's captured step with it."""

from __future__ import annotations

import itertools
import pickle

import pytest
import torch

from lt2dsl.lowering import compile_model, fx_passes
from lt2dsl.lowering.fx_passes import prefetch
from lt2dsl.lowering.fx_passes.manager import Ctx

from ..util import call, resolved, tokens

BODY = f"loop T=2 < {call('gdn')}; {call('dsa')} >"


def model_with(opt_in=("l2_prefetch",), body: str = BODY, device: str = "cpu", **kw):
    torch.manual_seed(0)
    opts = {"backend": "reference", "dtype": torch.float64, "device": device, **kw}
    model = compile_model(resolved(body, tie_embeddings="true"), opt_in=opt_in, **opts).eval()
    model.build_graph()  # traced and fused here: `fx_passes.COUNTERS` are this model's
    return model


@pytest.mark.parametrize("budget", [1, 7, 40, 10**6])
def test_stream_spans_ask_for_each_byte_at_most_once_a_budget_ahead(budget):
    """After projection j the span starts where the last one ended (never before the end of j's
    weights) and ends `budget` past them; the head asks for the first `budget` bytes. No byte is
    asked for twice a step, none more than `budget` ahead of the projection reading it, and with
    a budget of at least the largest projection the spans tile the whole stream."""
    sizes = [5, 12, 3, 30, 8, 1, 20]
    spans = prefetch.stream_spans(sizes, budget)
    total, ends = sum(sizes), list(itertools.accumulate(sizes))
    for (lo, hi), end in zip(spans[:-1], ends):
        assert lo >= end and hi <= end + budget and lo <= hi
    assert spans[-1] == (0, min(budget, total))
    covered = sorted(x for x in spans if x[1] > x[0])
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(covered)), f"overlap: {covered}"
    if budget >= max(sizes):
        assert covered[0][0] == 0 and covered[-1][1] == total
        assert all(a[1] == b[0] for a, b in itertools.pairwise(covered)), f"gap: {covered}"


@pytest.mark.parametrize("opt_in", [("l2_prefetch",), ("decode_gemv", "l2_prefetch")], ids=["plain", "gemv"])
def test_the_graph_asks_for_the_planned_pieces_after_each_projection(opt_in, monkeypatch):
    """Each projection is followed by one `prefetch_after` whose weights and (offset, n) ranges are
    the plan's pieces of its span (a 20 kB budget: spans cross weights and reach past the next
    projection), the head's the next step's first bytes; one join before the output."""
    monkeypatch.setattr(prefetch, "MAX_BYTES", 20000)
    gm = model_with(opt_in).graph_module
    gm.graph.lint()
    ctx = Ctx(gm, "reference")
    projs = [n for n in gm.graph.nodes if prefetch.weights(ctx, n) is not None]
    # the tied head reads the embedding; 2 iterations of a GDN and a DSA block: in-proj, o_proj,
    # gate/up and down of each (decode_gemv folds o_proj/down with the next in-proj or gate/up)
    assert len(projs) == (2 * 2 * 4 + 1 if opt_in == ("l2_prefetch",) else 2 * 2 * 2 + 1 + 1)
    planned = prefetch.plan(ctx, 20000)
    seen = 0
    for n in gm.graph.nodes:
        if n.target is not prefetch.prefetch_after:
            continue
        proj = n.args[0]
        pieces = planned[proj]
        got = [
            (w.target if w.op == "get_attr" else w, off, b)
            for w, (off, b) in zip(n.args[1:], n.kwargs["ranges"])
        ]
        want = [(w.target if getattr(w, "op", None) == "get_attr" else w, off, b) for w, off, b in pieces]
        assert got == want, proj.name
        assert sum(b for _, _, b in pieces) > 0
        seen += 1
    assert seen == fx_passes.COUNTERS["l2_prefetch"] == sum(1 for p in projs if planned[p])
    assert planned[projs[-1]][0][1] == 0  # the head asks for the stream's start
    assert seen > len(projs) // 2  # most spans are not empty at this budget
    assert any(len(planned[p]) > 1 for p in projs)  # and some reach past the next weight
    nodes = list(gm.graph.nodes)
    assert nodes[-2].target is prefetch.prefetch_join and nodes[-1].op == "output"
    assert sum(n.target is prefetch.prefetch_join for n in nodes) == 1


def test_results_are_the_graphs_without_it_and_a_second_run_adds_nothing():
    ids = tokens(2, 7)
    plain, with_rule = model_with(()), model_with()
    with torch.no_grad():
        assert torch.equal(with_rule(ids), plain(ids))
        cache = with_rule.new_cache(2)
        with_rule(ids, cache)
        step = with_rule(ids[:, :1], cache)
        cache = plain.new_cache(2)
        plain(ids, cache)
        assert torch.equal(step, plain(ids[:, :1], cache))
    code = with_rule.graph_module.code
    again = fx_passes.fuse(with_rule.graph_module, opt_in=["l2_prefetch"])
    assert not again.modified and with_rule.graph_module.code == code
    restored = pickle.loads(pickle.dumps(with_rule))  # the graph is rebuilt from its passes on load
    restored.build_graph()
    with torch.no_grad():
        assert torch.equal(restored(ids), plain(ids))
    assert "prefetch_after" in restored.graph_module.code


def test_it_applies_to_decode_sized_products_without_autograd_only():
    x = torch.ones(2, 1, 8)
    assert not prefetch.applies(x)  # not on CUDA
    assert not prefetch.applies(None) and not prefetch.applies(("a", 1))


@pytest.mark.gpu
def test_gpu_decode_with_prefetch_gives_the_same_tokens(monkeypatch):
    """The engine's captured step with the rule: the same greedy tokens as without it, prefetches
    made in the decode steps and none in the prefill of 40 rows."""
    from lt2dsl.engine import Engine

    calls = []
    real = prefetch.l2_prefetch
    monkeypatch.setattr(
        prefetch, "l2_prefetch", lambda w, n, offset=0: calls.append(n) or real(w, n, offset=offset)
    )
    kw = {"backend": "auto", "dtype": torch.bfloat16, "device": "cuda"}
    ids = tokens(2, 20).cuda()
    plain = model_with((), **kw)  # the engine holds its model weakly
    want = Engine(plain).generate(ids, 6)
    model = model_with(**kw)
    with torch.no_grad():
        model(ids)
    assert not calls, "a 40-row prefill prefetched"
    got = Engine(model).generate(ids, 6)
    assert torch.equal(got, want)
    assert calls and all(0 < n <= prefetch.MAX_BYTES for n in calls)
