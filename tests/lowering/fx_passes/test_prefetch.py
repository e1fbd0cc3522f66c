"""The opt-in rule `l2_prefetch`: where it puts the prefetches (after each projection, the next
projection's weights; the last wraps to the first; one join before the output), that the graph's
results do not change, its byte budget, and on a GPU the engine's captured step with it."""

from __future__ import annotations

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


def _weight_key(node) -> object:
    """A weight operand as the parameter it reads: get_attr nodes by target, others by identity."""
    return node.target if node.op == "get_attr" else node


def schedule(gm) -> list[tuple[object, list, list]]:
    """(projection node, its weights, the weights of the prefetch that follows it) in graph order."""
    ctx, out, last = Ctx(gm, "reference"), [], None
    for n in gm.graph.nodes:
        ws = prefetch.weights(ctx, n)
        if ws is not None:
            last = [n, [_weight_key(w) if not isinstance(w, str) else w for w in ws], None]
            out.append(last)
        elif n.target is prefetch.prefetch_after:
            assert last is not None and last[2] is None, f"{n.name} follows no projection or a second time"
            assert n.args[0] is last[0], f"{n.name} is anchored on {n.args[0]}, not {last[0].name}"
            last[2] = [_weight_key(w) for w in n.args[1:]]
    return [tuple(x) for x in out]


@pytest.mark.parametrize("opt_in", [("l2_prefetch",), ("decode_gemv", "l2_prefetch")], ids=["plain", "gemv"])
def test_each_projection_prefetches_the_next_ones_weights(opt_in):
    model = model_with(opt_in)
    gm = model.graph_module
    gm.graph.lint()
    steps = schedule(gm)
    # the tied head reads the embedding; 2 iterations of a GDN and a DSA block: in-proj, o_proj,
    # gate/up and down of each (decode_gemv folds o_proj/down with the next in-proj or gate/up)
    assert len(steps) == (2 * 2 * 4 + 1 if opt_in == ("l2_prefetch",) else 2 * 2 * 2 + 1 + 1)
    assert fx_passes.COUNTERS["l2_prefetch"] == len(steps)
    for (node, _, fetched), (_, want, _) in zip(steps, steps[1:] + steps[:1]):
        assert fetched == want, node.name
    assert steps[-1][1] == ["embed.weight"]
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


def test_budget_takes_weights_in_order_until_it_is_spent():
    a, b, c = (torch.empty(n, 8, dtype=torch.bfloat16) for n in (64, 32, 16))  # 1024, 512, 256 bytes
    assert [(w is x, n) for (w, n), x in zip(prefetch.budget([a, b, c], 1 << 20), (a, b, c))] == [
        (True, 1024),
        (True, 512),
        (True, 256),
    ]
    assert [n for _, n in prefetch.budget([a, b, c], 1200)] == [1024, 176]
    assert [n for _, n in prefetch.budget([a.t(), b], 600)] == [512]  # a view it cannot address takes nothing
    assert prefetch.budget([a], 0) == []


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
    monkeypatch.setattr(prefetch, "l2_prefetch", lambda w, n: calls.append(n) or real(w, n))
    kw = {"backend": "auto", "dtype": torch.bfloat16, "device": "cuda"}
    ids = tokens(2, 20).cuda()
    want = Engine(model_with((), **kw)).generate(ids, 6)
    model = model_with(**kw)
    with torch.no_grad():
        model(ids)
    assert not calls, "a 40-row prefill prefetched"
    got = Engine(model).generate(ids, 6)
    assert torch.equal(got, want)
    assert calls and all(0 < n <= prefetch.MAX_BYTES for n in calls)
