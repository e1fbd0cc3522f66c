"""The lowered modules agree with the static estimate (estimate.md "Agreement"), on every example.

The examples are full-size models, so they run on the `meta` device: no memory, no compute, but
parameter shapes, cache tensors and `FlopCounterMode` all work there. Per example, one prefill of
B × L tokens through a cache, under `FlopCounterMode`, over the reference (pure PyTorch) lowering:

* `sum(p.numel())` == `params.stored`, exactly (and the names are `model_weights`);
* `cache.nbytes()` == `memory.state_bytes + memory.kv_bytes`, exactly;
* counted FLOPs per token within 2% of `flops_per_token.prefill` (`--causal full`: the reference
  attention computes the whole masked square, as FlopCounterMode counts it).

The estimate's dtypes default to the model's own, so the cache bytes agree for bf16, fp16 and fp32
models, with and without each of `--dtype`, `--state-dtype` and `--kv-dtype`.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import lt2dsl
from lt2dsl.cli import build_parser
from lt2dsl.cost.cli import options_from
from lt2dsl.cost.estimate import EstimateOptions, estimate, model_weights
from lt2dsl.dtypes import nbytes

from .util import lower, resolved, tokens

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
    """The estimate in the model's own dtypes (the default of every dtype)."""
    return estimate(model, EstimateOptions(seq=L, batch=B, causal="full"))


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


@pytest.mark.parametrize(
    "body",
    [
        "loop T=4, final_norm=true < full >",
        "loop T=2, final_norm=true < swa(window=8) >; full",
        "loop T=3 < loop T=2, final_norm=true < full > >",
        "loop T=3 < full >",
    ],
)
def test_final_norm_applications_are_the_graphs(body):
    """The estimate counts the final norm's executed weights once per call in the lowered graph."""
    model = lower(body)
    nodes = model.graph_module.graph.nodes
    calls = sum(1 for n in nodes if n.op == "call_module" and n.target == "final_norm")
    (head,) = [r for r in report(model.ir, 8).extras if r.id == "head"]
    assert head.params_executed == calls * model.config.dim and calls >= 1


# ---- dtypes: the model's own by default, each flag on its own ---------------------------------

# full's `k`, `v` grow with the context (the kv dtype); gdn's state and conv buffers do not.
DTYPE_BODY = "loop T=2 < full; gdn >"
KV_NAMES = ("k", "v")
FLAGS = [
    (),
    ("--dtype", "fp32"),
    ("--dtype", "fp16"),
    ("--state-dtype", "bf16"),
    ("--kv-dtype", "fp32"),
    ("--kv-dtype", "fp16"),
]


def lowered_cache_bytes(model_dtype: str, flags: dict[str, str], L: int) -> tuple[int, int]:
    """(state bytes, kv bytes) of the lowered model's cache after a meta prefill of B × L tokens,
    built with the dtypes the flags name: `--dtype` as `compile(dtype=...)`, `--state-dtype` as
    the `state_dtype` setting. The lowering keeps KV caches in its compute dtype, so a
    `--kv-dtype` resizes the KV tensors it allocated."""
    settings = {"dtype": model_dtype}
    if "--state-dtype" in flags:
        settings["state_dtype"] = flags["--state-dtype"]
    ir = resolved(DTYPE_BODY, **settings)
    model = lt2dsl.compile(ir, backend="reference", device="meta", dtype=flags.get("--dtype"))
    kv = model.new_cache(B)
    with torch.no_grad():
        model(torch.zeros(B, L, dtype=torch.long, device="meta"), kv)
    tensors = [(name, t) for e in kv.entries for name, t in e.items()]
    state = sum(t.numel() * t.element_size() for name, t in tensors if name not in KV_NAMES)
    kv_tensors = [t for name, t in tensors if name in KV_NAMES]
    if "--kv-dtype" in flags:
        return state, sum(t.numel() for t in kv_tensors) * nbytes(flags["--kv-dtype"])
    return state, sum(t.numel() * t.element_size() for t in kv_tensors)


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: " ".join(f) or "no-flag")
@pytest.mark.parametrize("model_dtype", ["bf16", "fp16", "fp32"])
def test_cache_bytes_match_in_every_dtype(model_dtype, flags):
    """`compile --estimate` (its flags parsed as the CLI does) sizes the cache as the lowering
    allocates it: a flag left out means the model's own dtype, never a fixed bf16."""
    L = 8
    argv = ["compile", "m.lt2", "--estimate", "--seq", str(L), "--batch", str(B), *flags]
    ir = resolved(DTYPE_BODY, dtype=model_dtype)
    (opt,) = options_from(build_parser(for_compile=True).parse_args(argv), ir)
    mem = estimate(ir, opt).memory
    given = dict([flags]) if flags else {}
    assert (mem.state_bytes, mem.kv_bytes) == lowered_cache_bytes(model_dtype, given, L)
    assert mem.kv_bytes > 0 and mem.state_bytes > 0
