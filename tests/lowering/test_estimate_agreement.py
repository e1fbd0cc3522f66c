"""The lowered modules agree with the static estimate (estimate.md "Agreement"), on every example.

The examples are full-size models, so they run on the `meta` device: no memory, no compute, but
parameter shapes, cache tensors and `FlopCounterMode` all work there. Per example, one prefill of
B × L tokens through a cache, under `FlopCounterMode`, over the reference (pure PyTorch) lowering:

* `sum(p.numel())` == `params.stored`, exactly (and the names are `model_weights`);
* `cache.nbytes()` == `memory.state_bytes + memory.kv_bytes`, exactly;
* counted FLOPs per token within 2% of `flops_per_token.prefill` (`--causal full`: the reference
  attention computes the whole masked square, as FlopCounterMode counts it).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import lt2dsl
from lt2dsl.cost.estimate import EstimateOptions, estimate, model_weights
from lt2dsl.ir.spec import Dtypes

from .util import lower, tokens

EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.lt2"))
# One chunk of the chunked kernels (C = 64) keeps the meta run short; the sliding-window example
# runs past its window (512) so the ring buffer's cap is measured too.
LENGTHS = {"lt2_sparse_swa": 640}
B = 2
# Models with ~100 block applications take several seconds each on meta.
SLOW = {
    "lt2_hybrid_full_gdn",
    "lt2_hybrid_gdn_dsa",
    "lt2_linear_gdn",
    "lt2_sparse_dsa",
    "lt2_sparse_nsa",
    "lt2_sparse_swa",
    "ouro_looped_transformer",
}


def example_params(slow: bool = True):
    return [
        pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if slow and p.stem in SLOW else [])
        for p in EXAMPLES
    ]


@cache
def built(path: Path):
    """(resolved model, lowered module on meta) of one example, through the public API."""
    lowered = lt2dsl.compile(path, backend="reference", device="meta")
    return lowered.ir, lowered


@cache
def measured(path: Path) -> tuple[int, int, float]:
    """(L, cache bytes, FLOPs per token) of one meta prefill of B × L tokens through a cache."""
    _, lowered = built(path)
    L = LENGTHS.get(path.stem, 64)
    kv = lowered.new_cache(B)
    ids = torch.zeros(B, L, dtype=torch.long, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        lowered(ids, kv)
    return L, kv.nbytes(), counter.get_total_flops() / (B * L)


def report(model, L: int):
    cfg = model.config
    dt = Dtypes(act=cfg.dtype, state=cfg.state_dtype, kv=cfg.dtype)  # KV caches in the compute dtype
    return estimate(model, EstimateOptions(seq=L, batch=B, causal="full", dtypes=dt))


def test_every_example_is_covered():
    assert len(EXAMPLES) >= 16


@pytest.mark.parametrize("path", example_params(slow=False))
def test_parameters_match_exactly(path):
    model, lowered = built(path)
    assert {k: tuple(p.shape) for k, p in lowered.named_parameters()} == model_weights(model)
    assert sum(p.numel() for p in lowered.parameters()) == report(model, 64).params.stored


@pytest.mark.parametrize("path", example_params())
def test_cache_bytes_after_prefill_match_exactly(path):
    model, _ = built(path)
    L, nbytes, _ = measured(path)
    mem = report(model, L).memory
    assert nbytes == mem.state_bytes + mem.kv_bytes


@pytest.mark.parametrize("path", example_params())
def test_flops_within_two_percent(path):
    model, _ = built(path)
    L, _, flops = measured(path)
    want = report(model, L).flops_per_token.prefill
    assert math.isclose(flops, want, rel_tol=0.02), f"counted {flops:.4g} vs estimate {want:.4g}"


# ---- small models: the model-level extras, counted exactly ------------------------------------


def counted(body: str, L: int, **settings):
    model = lower(body, dtype=torch.float32, **settings)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(tokens(1, L), model.new_cache(1))
    return model, counter.get_total_flops() / L


@pytest.mark.parametrize(
    "body",
    [
        "full(heads=4, kv_heads=2, gate=sdpa); swa(window=8)",
        "loop T=3, final_norm=true, exit=gate < swa(window=8); full >",
        "par(full, swa(window=4)); full(mlp=gelu(hidden=40))",
    ],
)
def test_attention_models_count_exactly(body):
    """Attention and MLPs are all matmuls: the counter and the estimate agree to the FLOP."""
    model, flops = counted(body, 24, tie_embeddings="false")
    assert flops == report(model.ir, 24).flops_per_token.prefill


def test_inject_concat_adapter_counted_like_the_estimate():
    model, flops = counted("loop T=3, inject=concat < swa(window=8) >", 24)
    assert flops == report(model.ir, 24).flops_per_token.prefill
