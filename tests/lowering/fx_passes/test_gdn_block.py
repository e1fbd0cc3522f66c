"""The opt-in rule `gdn_block` in the graph: where it fires, that everything but a one-token 16-bit
step runs the nodes it replaced (outputs and gradients equal the default fused graph's), that a
bf16 model's decode steps launch the block kernel and give the logits of the same model without
the rule (CPU interpreter: the kernel's six phases as six launches), and its pattern /
replacement pair."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.lowering import compile_model, fx_passes
from tests.kernels.utils import DEVICE

from ..util import call, resolved, tokens
from .helpers import assert_rule_changes_nothing_off_its_step

BODY = f"loop T=2 < {call('gdn')}; {call('swa')} >"


def model_with(body: str, opt_in=("gdn_block",), settings: dict | None = None, **kw):
    torch.manual_seed(0)
    kw = {"backend": "reference", "dtype": torch.float64, **kw}
    model = compile_model(resolved(body, **(settings or {})), fuse=True, opt_in=opt_in, **kw)
    model.build_graph()
    return model


def test_fires_once_per_gdn_application_with_gdn_decode():
    model = model_with(BODY)
    assert fx_passes.COUNTERS["gdn_decode"] == 2 and fx_passes.COUNTERS["gdn_block"] == 2
    code = model.graph_module.code
    assert "gdn_block_step" in code and "gdn_step_linear" not in code and "swiglu(" in code  # swa's MLP
    model_with(f"{call('gdn')}; gdn(gate=false, expand_v=1)")
    assert fx_passes.COUNTERS["gdn_block"] == 1  # no output gate: gdn_decode leaves it, so does this rule
    model_with(f"{call('gdn')}; {call('swa')}", settings={"mlp": "gelu(hidden=64)"})
    assert fx_passes.COUNTERS["gdn_decode"] == 1 and fx_passes.COUNTERS["gdn_block"] == 0  # no SwiGLU


def test_prefill_and_training_run_the_replaced_nodes():
    """Float64 reference backend, a prompt and a cache: outputs and every parameter's gradient
    equal the default graph's (the leaf's fallback is the replaced nodes, in their order)."""
    assert_rule_changes_nothing_off_its_step(model_with(BODY, ()), model_with(BODY), tokens(2, 6))


def test_bf16_decode_steps_launch_the_block_kernel(monkeypatch):
    """bf16 on the Triton path: two rows prefilled, then four one-token steps through a dynamic
    cache; each step runs the block kernel once per GDN application and its logits are the same
    model's without the rule (gdn_decode only) within bf16 rounding."""
    from lt2dsl.lowering.fx_passes import gdn_block as rule

    calls = []
    real = rule.gdn_block_decode
    monkeypatch.setattr(
        rule, "gdn_block_decode", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k)
    )
    kw = {"backend": "triton", "dtype": torch.bfloat16, "device": DEVICE}
    body = f"{call('gdn')}; gdn(heads=2, v_heads=4, head_dim=8, expand_v=1); {call('swa')}"
    ruled, base = model_with(body, **kw), model_with(body, ("gdn_decode",), **kw)
    assert fx_passes.COUNTERS["gdn_decode"] == 2
    ids = tokens(2, 9).to(DEVICE)
    with torch.no_grad():
        c1, c2 = base.new_cache(2, max_len=9), ruled.new_cache(2, max_len=9)
        torch.testing.assert_close(ruled(ids[:, :5], c2), base(ids[:, :5], c1), rtol=0, atol=0)
        assert calls == []  # prefill runs the replaced nodes
        for i in range(5, 9):
            want, got = base(ids[:, i : i + 1], c1), ruled(ids[:, i : i + 1], c2)
            err = (got.float() - want.float()).norm() / want.float().norm()
            assert torch.isfinite(got).all() and err < 2e-2, (i, float(err))
    assert calls == [2] * (2 * 4)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_pattern_and_replacement_agree(bias):
    from lt2dsl.kernels.block.testing import as_dtype, inputs
    from tests.kernels.test_gdn_block import SHAPE

    args, kw = inputs(bias, 0, SHAPE, DEVICE)
    rule = fx_passes.OPT_IN["gdn_block"]
    rounded = as_dtype(args, torch.bfloat16)
    got = rule.replacement(**as_dtype(rounded, torch.bfloat16), **kw)
    want = rule.pattern(**as_dtype(rounded, torch.float64), **kw)
    for g, w in zip(got, want):
        assert float((g.double() - w).norm() / w.norm()) < 2e-2
