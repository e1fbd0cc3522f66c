"""`lowering/leaf.py`: a `@leaf` is one graph node however it is called, and only while tracing."""

import torch
from torch import nn

from lt2dsl.lowering import functional as lf
from lt2dsl.lowering import leaf as leaf_module
from lt2dsl.lowering.functional import short_conv
from lt2dsl.lowering.functional_recurrent import conv_silu
from lt2dsl.lowering.leaf import is_leaf, leaf, leaves
from lt2dsl.lowering.to_fx import Unrolled, trace


@leaf
def double(x: torch.Tensor) -> torch.Tensor:
    """A leaf defined outside the lowering (a test module)."""
    if x.shape[0] > 0:  # data-dependent code: tracing into it would fail
        return 2 * x
    return x


class Calls(nn.Module):
    """Calls leaves every way a layer may: imported by name, as a module attribute, from a helper
    in another module (`conv_silu` calls `short_conv`), and defined here."""

    def __init__(self):
        super().__init__()
        self.q_conv1d = nn.Conv1d(4, 4, 3, groups=4, bias=False)

    def forward(self, x):
        a = short_conv(x, self.q_conv1d.weight, None, None, "a")
        b = lf.short_conv(x, self.q_conv1d.weight, None, None, "b")
        c = conv_silu(self, x, "q", None, 3)
        return double(a + b + c)


def test_every_call_of_a_leaf_is_one_node():
    m = Calls()
    gm = trace(m)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(lf.short_conv) == 3 and targets.count(double) == 1
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(gm(x), m(x))


def test_the_globals_are_restored_after_tracing():
    trace(Calls())
    assert lf.short_conv is short_conv and is_leaf(lf.short_conv) and is_leaf(double)
    assert vars(leaf_module)["leaf"] is leaf and not is_leaf(conv_silu)


def test_the_registry_holds_the_lowerings_leaves():
    import lt2dsl.lowering.functional_sparse
    import lt2dsl.lowering.fx_passes.leaves  # noqa: F401

    names = {f.__name__ for f in leaves()}
    assert {"cache_entry", "cache_advance", "short_conv", "attention_core", "gated_delta_rule_core"} <= names
    assert {"dsa_attend", "toeplitz_cached", "conv_silu_cached", "kda_core_normed"} <= names


def test_parameters_are_found_by_one_scan_under_the_names_torch_gives_them(monkeypatch):
    """Parameters reached while tracing become `get_attr` nodes named as torch's own tracer names
    them (a tied weight by its first name), with the root's parameters listed once per trace (a
    scan per access made a full-size looped model's trace quadratic in its size)."""
    from .util import lower

    model = lower("loop T=2 < gdn(expand_v=1); swa(window=4) >", tie_embeddings="true")
    want = model.graph_module.code
    scans = []
    named = Unrolled.named_parameters

    def counted(module, *args, **kwargs):
        scans.append(module)
        return named(module, *args, **kwargs)

    monkeypatch.setattr(Unrolled, "named_parameters", counted)
    model.rebuild_graph()
    assert model.graph_module.code == want and len(scans) == 1
    monkeypatch.setattr(leaf_module.LeafTracer, "getattr", torch.fx.Tracer.getattr)
    model.rebuild_graph()
    assert model.graph_module.code == want and len(scans) > 10
