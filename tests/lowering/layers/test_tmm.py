"""`tmm` layer (ToeplitzMixer): spec contract, decode = forward, the dense masked Toeplitz product,
init, max_len, gradients, bad input, fx tracing."""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx

from lt2dsl.ir.nodes import MlpSpec, ModelConfig, NormSpec
from lt2dsl.ir.registry import lookup
from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.layers.tmm import ToeplitzMixer
from tests.kernels.utils import assert_close

F64 = torch.float64
VARIANTS = {
    "single": dict(heads=1, kernel=1),
    "heads4": dict(heads=4, kernel=1),
    "heads2-kernel3": dict(heads=2, kernel=3),
}


def config(**kw) -> ModelConfig:
    base = dict(dim=32, vocab=64, heads=4, head_dim=8, kv_heads=4, mlp=MlpSpec(type="none"),
                norm=NormSpec(), max_len=40)
    return ModelConfig(**(base | kw))


def resolved(kind: str, cfg: ModelConfig, **given) -> dict:
    """Options as the resolve pass fills them: the given values, spec defaults for the rest."""
    opts: dict = {}
    for o in lookup(kind).options:
        if o.name not in ("mlp", "norm", "name"):
            opts[o.name] = given[o.name] if o.name in given else o.default_for(cfg, given | opts)
    return opts


def make_layer(dtype=F64, seed=0, cfg=None, **given) -> ToeplitzMixer:
    """A layer with its own init, plus a random position bias and projection biases (init: zeros)."""
    cfg = cfg or config()
    torch.manual_seed(seed)
    layer = ToeplitzMixer(resolved("tmm", cfg, **given), cfg).to(dtype)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return layer


def run_in_pieces(layer, x, pieces: list[int]) -> tuple[torch.Tensor, Entry]:
    """Prefill chunks of the given lengths, then one token at a time to the end of x."""
    entry, outs, t = Entry(), [], 0
    for n in pieces:
        outs.append(layer(x[:, t : t + n], entry, t))
        t += n
    while t < x.shape[1]:
        outs.append(layer(x[:, t : t + 1], entry, t))
        t += 1
    return torch.cat(outs, dim=1), entry


def truth(layer, x):
    """mixers.md §13 with a dense masked Toeplitz matrix per (tap, head), in float64.

    y[c, t] = Σ_j Σ_{s≤t} w[j, η(c), t − s] · u[c − k + 1 + j, s] + b[η(c), t], u = in_proj(x) (heads > 1).
    """
    P, (B, T, D) = dict(layer.named_parameters()), x.shape
    heads, k = layer.heads, layer.kernel
    u = x @ P["in_proj.weight"].T + P["in_proj.bias"] if heads > 1 else x
    lag = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    y = torch.zeros(B, T, D, dtype=F64)
    for c in range(D):
        eta = c // (D // heads)
        for j in range(k):
            src = c - k + 1 + j
            if src < 0:
                continue
            M = torch.where(lag >= 0, P["w"][j, eta][lag.clamp(min=0)], 0.0)  # M[t, s] = w[t − s]
            y[:, :, c] += u[:, :, src] @ M.T
        y[:, :, c] += P["bias"][eta, :T]
    return y @ P["out_proj.weight"].T + P["out_proj.bias"] if heads > 1 else y


# ---- tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_parameters_are_the_spec_weights(variant):
    cfg = config()
    layer = ToeplitzMixer(resolved("tmm", cfg, **variant), cfg)
    got = {n: tuple(p.shape) for n, p in layer.named_parameters()}
    assert got == lookup("tmm").weights(layer.opts, cfg)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("L", [1, 13])
def test_cache_after_prefill_is_the_spec_layout(dtype, L):
    layer = make_layer(dtype, **VARIANTS["heads4"])
    entry = Entry()
    layer(torch.randn(3, L, 32, dtype=dtype), entry, 0)
    spec = lookup("tmm").cache(layer.opts, layer.cfg, 3, L)
    assert {n: tuple(t.shape) for n, t in entry.items()} == {n: c.shape for n, c in spec.items()}
    assert entry["x"].dtype == dtype  # the activation dtype


def test_cache_holds_the_mixer_inputs_after_in_proj():
    layer = make_layer(**VARIANTS["heads4"])
    x, entry = torch.randn(2, 6, 32, dtype=F64), Entry()
    layer(x, entry, 0)
    assert_close("cached u", entry["x"], layer.in_proj(x), 1e-15)


@pytest.mark.parametrize("pieces", [[1], [10], [4, 7]], ids=["1", "10", "4+7"])
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_prefill_then_decode_equals_one_forward(variant, pieces):
    layer = make_layer(**variant)
    x = torch.randn(2, 19, 32, dtype=F64)
    out, entry = run_in_pieces(layer, x, pieces)
    assert_close("decode", out, layer(x), 1e-12)
    assert entry["x"].shape == (2, 19, 32)


@pytest.mark.parametrize("T", [1, 17, 40])
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_equals_the_dense_masked_toeplitz_product(variant, T):
    layer = make_layer(**variant)
    x = torch.randn(2, T, 32, dtype=F64)
    assert_close("tmm", layer(x), truth(layer, x), 1e-12)


def test_init_is_kaiming_normal_with_fan_in_max_len():
    cfg = config(max_len=256)
    layer = ToeplitzMixer(resolved("tmm", cfg, heads=4, kernel=2), cfg)
    std = layer.w.detach().std().item()
    # 2048 samples: the sample std is within ~5% of sqrt(2 / n) with overwhelming probability
    assert abs(std / math.sqrt(2 / 256) - 1) < 0.1
    assert abs(layer.w.detach().mean().item()) < 0.1 * std
    for name in ("bias", "in_proj.bias", "out_proj.bias"):
        assert torch.count_nonzero(layer.get_parameter(name)) == 0, name
    assert abs(layer.in_proj.weight.detach().std().item() / 0.02 - 1) < 0.1


def test_max_len_is_the_longest_sequence():
    layer = make_layer(**VARIANTS["heads2-kernel3"])
    x = torch.randn(1, 41, 32, dtype=F64)
    layer(x[:, :40])  # exactly max_len is fine
    with pytest.raises(ValueError, match="max_len is 40"):
        layer(x)
    entry = Entry()
    layer(x[:, :38], entry, 0)
    layer(x[:, 38:40], entry, 38)
    with pytest.raises(ValueError, match="max_len is 40"):
        layer(x[:, 40:41], entry, 40)
    assert entry["x"].shape[1] == 40  # the failed step left the cache alone


def test_gradcheck_input_kernel_and_bias():
    cfg = config(dim=4, max_len=8)
    layer = make_layer(cfg=cfg, heads=2, kernel=2)
    x = torch.randn(1, 6, 4, dtype=F64, requires_grad=True)
    names = ["w", "bias", "in_proj.weight", "out_proj.bias"]
    params = [layer.get_parameter(n).detach().clone().requires_grad_() for n in names]

    def f(x, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.randn(2, 5, 31, dtype=F64), r"\[B, T, D=32\]"),
        (torch.randn(5, 32, dtype=F64), r"\[B, T, D=32\]"),
        (torch.randn(2, 5, 32, dtype=torch.float32), "dtype torch.float64"),
        (torch.randn(2, 0, 32, dtype=F64), "at least one token"),
    ],
    ids=["dim", "rank", "dtype", "empty"],
)
def test_bad_input_raises_value_error(bad, match):
    with pytest.raises(ValueError, match=match):
        make_layer(**VARIANTS["heads4"])(bad)


def test_traces_with_one_core_node_and_same_results():
    layer = make_layer(**VARIANTS["heads2-kernel3"])
    gm = torch.fx.symbolic_trace(layer)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    targets = [getattr(n.target, "__name__", str(n.target)) for n in calls]
    assert targets.count("toeplitz_cached") == 1
    x = torch.randn(2, 12, 32, dtype=F64)
    assert_close("traced", gm(x), layer(x), 1e-14)
    entry = Entry()
    out = torch.cat([gm(x[:, :7], entry, 0), *(gm(x[:, t : t + 1], entry, t) for t in range(7, 12))], 1)
    assert_close("traced decode", out, layer(x), 1e-12)
