"""The decode step's fused Triton kernels end to end (CPU interpreter here): the q, k, v convs'
step with their histories shifted in place, RoPE of q and k at each row's position writing k and v
into their cache slots (DSA's index key LayerNorm-ed in the same launch), DSA's selection at
each row's position, NSA's decode kernels, a sandwich block's norm-add-norm, RetNet's xPos and
Mamba2's gates. A fused fp32 model on
`backend="triton"`: rows of different lengths decode together through the static cache and one at
a time through a dynamic cache, and every step's logits equal one forward over that row's tokens
so far."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.engine import StaticCache

from ..lowering.util import call, lower, tokens
from .test_static import LENGTHS, STEPS, assert_static_equals_forward

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BODY = f"{call('gdn')}; {call('full', 'rope_dim=8')}; {call('dsa')}"
TOL = 2e-4  # fp32 kernels: the recurrent step against the chunked forward


def triton_model(body: str = BODY, **settings):
    return lower(body, dtype=torch.float32, backend="triton", device=DEVICE, fuse=True, **settings)


def assert_dynamic_equals_forward(model) -> None:
    """Two rows prefilled with max(LENGTHS) tokens, then STEPS one-token steps through a dynamic
    cache: each step's logits equal one forward over the row's tokens so far."""
    n = max(LENGTHS)
    ids = tokens(2, n + STEPS).to(DEVICE)
    cache = model.new_cache(2, max_len=n + STEPS)
    with torch.no_grad():
        model(ids[:, :n], cache)
        for i in range(STEPS):
            got = model(ids[:, n + i : n + i + 1], cache)[:, -1]
            torch.testing.assert_close(got, model(ids[:, : n + i + 1])[:, -1], rtol=TOL, atol=TOL)


def test_static_steps_equal_forward():
    model = triton_model()
    code = model.graph_module.code
    assert "conv_silu_group_cached" in code and "rope_append_cached" in code and "rope_pair" not in code
    cache = assert_static_equals_forward(model, max_len=16, tol=TOL)
    assert isinstance(cache, StaticCache)


def test_retnet_and_mamba2_steps_equal_forward():
    """RetNet's xPos of q and k (one launch, each row at its own position) and Mamba2's gates (one
    launch) in the decode steps, through a static and a dynamic cache."""
    model = triton_model(f"{call('retnet')}; {call('mamba2')}")
    code = model.graph_module.code
    assert "xpos_pair" in code and "mamba2_gates" in code
    assert_static_equals_forward(model, max_len=16, tol=TOL)
    assert_dynamic_equals_forward(model)


@pytest.mark.parametrize("sandwich", [False, True], ids=["pre-norm", "sandwich"])
def test_dynamic_steps_equal_forward(sandwich):
    model = triton_model(call("full"), norm="sandwich") if sandwich else triton_model()
    assert ("fused_norm_add_rmsnorm" in model.graph_module.code) == sandwich
    assert_dynamic_equals_forward(model)


@pytest.mark.parametrize("compress", ["mean", "mlp"])
def test_nsa_decode_kernels_in_the_static_step(monkeypatch, compress):
    """NSA at each row's position through its decode kernels (`kernels.nsa.triton_decode`: the
    block a step completes compressed in one launch for k and v, the compressed branch and
    block choice in one launch, DSA's sparse attention over the chosen
    blocks' tokens and over the window, the gated sum), not the dense reference: every step's
    logits equal one forward. Blocks of 2 tokens, so the rows' 4 choices include scored ones."""
    from lt2dsl.engine import cache, positions
    from lt2dsl.kernels.nsa import triton_decode

    calls = []

    def spy(name):
        real = getattr(triton_decode, name)
        return lambda *a, **k: calls.append(name) or real(*a, **k)

    for name in ("nsa_decode_triton", "compress_step"):
        monkeypatch.setattr(triton_decode, name, spy(name))
    monkeypatch.setattr(positions, "nsa_rows", lambda *a, **k: pytest.fail("the dense reference ran"))
    monkeypatch.setattr(cache, "compress_rows", lambda *a, **k: pytest.fail("the reference compression ran"))
    nsa = f"nsa(block=2, select=4, window=4, cmp_block=2, stride=1, kv_heads=1, compress={compress})"
    model = triton_model(f"{nsa}; {call('gdn')}")
    assert_static_equals_forward(model, max_len=16, tol=TOL)
    # per step: the compression of k and v (one launch), then the attention
    assert calls == ["compress_step", "nsa_decode_triton"] * STEPS


def gdn_decode_model(body: str = BODY, opt_in=("gdn_decode",)):
    """`triton_model`'s fused fp32 model with the opt-in rules `opt_in`."""
    from lt2dsl.lowering import compile_model

    from ..lowering.util import resolved

    torch.manual_seed(0)
    model = compile_model(resolved(body), backend="triton", dtype=torch.float32, device=DEVICE, fuse=True,
                          opt_in=opt_in)  # fmt: skip
    model.build_graph()
    return model


def test_gdn_decode_rule_steps_equal_forward(monkeypatch):
    """The opt-in rule `gdn_decode`: a GDN block's convs, recurrence and gated norm in two launches
    (`kernels.delta.gdn_step`) at every decode step, static and dynamic cache; every step's logits
    equal one forward, and the kernels ran at each step (longer prefill chunks and the forwards
    run the replaced nodes). A GDN block with grouped value heads (4 on 2 q/k heads) too."""
    from lt2dsl.lowering import fx_passes
    from lt2dsl.lowering.fx_passes import gdn_step as rule

    calls = []
    real = rule.gdn_step
    monkeypatch.setattr(rule, "gdn_step", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    body = f"{call('gdn')}; gdn(heads=2, v_heads=4, head_dim=8, expand_v=1); {call('full', 'rope_dim=8')}"
    model = gdn_decode_model(body)
    assert fx_passes.COUNTERS["gdn_decode"] == 2 and "gdn_step_linear" in model.graph_module.code
    assert_static_equals_forward(model, max_len=16, tol=TOL)
    # 2 GDN blocks at each of the STEPS steps, all rows at once (and the one-token chunks of a
    # row's chunked prefill, which the kernels take too)
    assert calls.count(len(LENGTHS)) == 2 * STEPS and set(calls) <= {1, len(LENGTHS)}
    calls.clear()
    assert_dynamic_equals_forward(model)
    assert calls == [2] * (2 * STEPS)
