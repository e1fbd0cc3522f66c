"""The opt-in rule `gdn_decode` in the graph: where it fires, that everything but a one-token step
runs the nodes it replaced (outputs and gradients equal the default fused graph's), and its
pattern / replacement pair (the kernel path's contract; the decode steps themselves are tested in
`tests/engine/test_triton_step.py`)."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.lowering import compile_model, fx_passes

from ..util import call, resolved, tokens
from .helpers import assert_rule_changes_nothing_off_its_step

BODY = f"loop T=2 < {call('gdn')}; {call('swa')} >"


def model_with(body: str, opt_in=("gdn_decode",)):
    torch.manual_seed(0)
    model = compile_model(resolved(body), backend="reference", dtype=torch.float64, fuse=True, opt_in=opt_in)
    model.build_graph()
    return model


def test_fires_once_per_gated_gdn_application_only():
    model_with(BODY)
    assert fx_passes.COUNTERS["gdn_decode"] == 2  # 2 iterations of one GDN block
    model_with(f"{call('gdn')}; gdn(gate=false, expand_v=1)")
    assert fx_passes.COUNTERS["gdn_decode"] == 1  # no output gate: the norm is not fla's gated one


def test_prefill_and_training_run_the_replaced_nodes():
    """Float64 reference backend, a prompt and a cache: outputs and every parameter's gradient
    equal the default graph's (the leaf's fallback is the replaced nodes, in their order)."""
    assert_rule_changes_nothing_off_its_step(model_with(BODY, ()), model_with(BODY), tokens(2, 6))


@pytest.mark.parametrize("dtype", [torch.float32], ids=str)
def test_pattern_and_replacement_agree(dtype):
    from tests.kernels.test_gdn_step import H, K, inputs

    x, ws, bs, hists, (A_log, dt_bias, state, gamma) = inputs(dtype, bias=False)
    w_o = torch.randn(16, gamma.shape[0] * state.shape[1], dtype=torch.float64).to(x["q"].device, dtype)
    kw = dict(heads=H, scale=K**-0.5, beta_scale=1.0, eps=1e-5)
    rule = fx_passes.OPT_IN["gdn_decode"]

    def args():
        fresh = (tuple(h.clone() for h in hists), A_log.float(), dt_bias.float(), state.float().clone())
        return (*(x[n] for n in "qkvabz"), ws, bs, *fresh, gamma.to(dtype), w_o)

    got, want = rule.replacement(*args(), **kw), rule.pattern(*args(), **kw)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
