"""Every layer kind honours the lowering contract (`lt2dsl/lowering/layers/base.py`).

Parameters are exactly the spec's `weights()` (names and shapes), the model's parameters exactly
the estimate's `model_weights()`, and the cache after a prefill of L tokens exactly the spec's
`cache()` layout: names, shapes and dtypes (state dtype for states, the compute dtype for conv
buffers, tmm inputs and KV caches).
"""

from __future__ import annotations

import pytest
import torch

from lt2dsl.cost.estimate import model_weights
from lt2dsl.ir.registry import lookup
from lt2dsl.lowering.layers import layer_class

from .util import KINDS, call, lower, resolved, tokens

# A compute dtype distinct from the fp32 state dtype, so "state" and "act" caches differ.
TORCH = {"state": torch.float32, "act": torch.bfloat16, "kv": torch.bfloat16}


@pytest.mark.parametrize("kind", KINDS)
def test_layer_class_matches_spec_module(kind):
    spec = lookup(kind)
    cls = layer_class(kind)
    assert f"{cls.__module__}:{cls.__name__}" == spec.module


@pytest.mark.parametrize("kind", KINDS)
def test_parameters_are_the_spec_weights(kind):
    model = lower(f"{call(kind)}; {call(kind, 'mlp=none')}", dtype=torch.float32)
    mixer_ir = model.ir.body[0].mixers[0]
    layer = model.blocks[0].mixers[0]
    want = lookup(kind).weights(mixer_ir.opts, model.config)
    got = {k: tuple(p.shape) for k, p in layer.named_parameters()}
    assert got == want
    whole = {k: tuple(p.shape) for k, p in model.named_parameters()}
    assert whole == model_weights(model.ir)


@pytest.mark.parametrize("kind", KINDS)
def test_cache_after_prefill_is_the_spec_layout(kind):
    model = lower(f"loop T=2 < {call(kind)} >", dtype=torch.bfloat16)
    B, L = 2, 11
    cache = model.new_cache(B)
    model(tokens(B, L), cache)
    mixer_ir = model.ir.body[0].body[0].mixers[0]
    want = lookup(kind).cache(mixer_ir.opts, model.config, B, L)
    assert len(cache.entries) == 2  # one per (iteration, block)
    for entry in cache.entries:
        got = {k: (tuple(t.shape), t.dtype) for k, t in entry.items()}
        assert got == {k: (c.shape, TORCH[c.dtype]) for k, c in want.items()}
    assert cache.seen == L


def test_par_block_prefixes_each_mixers_cache_and_parameters():
    model = lower("par(gdn(expand_v=1), swa(window=4))", dtype=torch.float32)
    assert {k for k, _ in model.named_parameters()} == set(model_weights(model.ir))
    cache = model.new_cache(1)
    model(tokens(1, 6), cache)
    (entry,) = cache.entries
    gdn, swa = (lookup(m.type).cache(m.opts, model.config, 1, 6) for m in model.ir.body[0].mixers)
    want = {f"0.{k}": c.shape for k, c in gdn.items()} | {f"1.{k}": c.shape for k, c in swa.items()}
    assert {k: tuple(t.shape) for k, t in entry.items()} == want


def test_float64_model_keeps_float64_states():
    model = lower("gdn(expand_v=1); full", dtype=torch.float64)
    cache = model.new_cache(1)
    model(tokens(1, 5), cache)
    assert {t.dtype for t in cache.tensors()} == {torch.float64}


def test_resolved_ids_are_unique_block_keys():
    model = resolved("loop T=2 < repeat 2 < gdn; full > >")
    lowered = lower("loop T=2 < repeat 2 < gdn; full > >")
    assert [b.block_id for b in lowered.blocks] == [b.id for b in model.body[0].body]


@pytest.mark.parametrize("kind", KINDS)
def test_output_projection_is_scaled_by_depth(kind):
    """GPT-2 init: the mixer's residual output projection has std 0.02 / sqrt(2 · applications)."""
    model = lower(f"loop T=8 < {call(kind)} >", dtype=torch.float32)
    layer = model.blocks[0].mixers[0]
    out = layer.o_proj if hasattr(layer, "o_proj") else layer.out_proj
    assert abs(out.weight.std().item() / (0.02 / 4) - 1) < 0.15
