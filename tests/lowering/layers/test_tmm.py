"""`tmm` layer (ToeplitzMixer): spec contract, decode = forward, the dense masked Toeplitz product,
init, max_len, gradients, bad input, fx tracing."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.layers.tmm import ToeplitzMixer
from lt2dsl.lowering.to_fx import trace
from tests.kernels.utils import assert_close
from tests.lowering.layers.contract import (
    F64,
    SPARSE_BAD_INPUTS,
    LayerContract,
    assert_cache_is_the_spec_layout,
    assert_traced_same,
    call_targets,
    gradcheck_params,
    model_config,
    resolved,
    run_in_pieces,
    seeded_layer,
)

VARIANTS = {
    "single": dict(heads=1, kernel=1),
    "heads4": dict(heads=4, kernel=1),
    "heads2-kernel3": dict(heads=2, kernel=3),
}


config = functools.partial(model_config, dim=32, heads=4, head_dim=8, kv_heads=4, max_len=40)


def make_layer(dtype=F64, seed=0, cfg=None, **given) -> ToeplitzMixer:
    """A layer with its own init, plus a random position bias and projection biases (init: zeros)."""

    def perturb(name, p):
        if name.endswith("bias"):
            p.normal_(0, 0.5)

    return seeded_layer(ToeplitzMixer, "tmm", cfg or config(), given, dtype, seed, perturb)


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


class TestTmm(LayerContract):
    KIND, CFG, BAD_GIVEN = "tmm", config(), VARIANTS["heads4"]
    VARIANTS = VARIANTS  # the module's
    BAD_INPUTS = SPARSE_BAD_INPUTS
    make = staticmethod(make_layer)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("L", [1, 13])
def test_cache_after_prefill_is_the_spec_layout(dtype, L):
    layer = make_layer(dtype, **VARIANTS["heads4"])
    entry = Entry()
    layer(torch.randn(3, L, 32, dtype=dtype), entry, 0)
    assert_cache_is_the_spec_layout("tmm", layer, entry, 3, L)
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
    assert gradcheck_params(layer, x, names)


def test_traces_with_one_core_node_and_same_results():
    layer = make_layer(**VARIANTS["heads2-kernel3"])
    gm = trace(layer)
    assert call_targets(gm).count("toeplitz_cached") == 1
    assert_traced_same(gm, layer, torch.randn(2, 12, 32, dtype=F64), 7)
