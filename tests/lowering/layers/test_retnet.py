"""`retnet` layer (lt2dsl.lowering.layers.retnet): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from lt2dsl.ir.nodes import MlpSpec, ModelConfig, NormSpec
from lt2dsl.ir.registry import lookup
from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.functional_recurrent import xpos_rotate
from lt2dsl.lowering.layers.retnet import MultiScaleRetention

KIND = "retnet"


def config(dim: int, heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(dim=dim, heads=heads, head_dim=head_dim, kv_heads=heads, mlp=MlpSpec(type="none"),
                       norm=NormSpec(), vocab=64)


CFG, TINY = config(32, 2, 8), config(8, 2, 4)
VARIANTS = [{}, {"expand_v": 1}, {"heads": 4, "head_dim": 4}]
DTYPES = {"state": torch.float32, "act": torch.bfloat16}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny shapes: intra-op threads only contend (CI runs two workers on two cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def resolved(cfg: ModelConfig, **given) -> dict:
    """Every option of the kind filled in, as the resolve pass does."""
    opts: dict = {}
    for o in lookup(KIND).options:
        if o.name not in ("mlp", "norm", "name"):
            opts[o.name] = given[o.name] if o.name in given else o.default_for(cfg, {**given, **opts})
    return opts


def make(cfg: ModelConfig = CFG, dtype=torch.float64, **given) -> MultiScaleRetention:
    """A layer with every parameter moved off its init, so gates, norms and convs all matter."""
    torch.manual_seed(0)
    layer = MultiScaleRetention(resolved(cfg, **given), cfg).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return layer


def decode(layer, x: torch.Tensor, n: int) -> tuple[torch.Tensor, Entry]:
    """Prefill x[:, :n] into a fresh entry, then feed the rest one token at a time."""
    entry = Entry()
    outs = [layer(x[:, :n], entry, 0)]
    outs += [layer(x[:, t : t + 1], entry, t) for t in range(n, x.shape[1])]
    return torch.cat(outs, dim=1), entry


@pytest.mark.parametrize("given", VARIANTS, ids=str)
def test_parameters_are_the_spec_weights(given):
    layer = make(**given)
    got = {k: tuple(p.shape) for k, p in layer.named_parameters()}
    assert got == lookup(KIND).weights(resolved(CFG, **given), CFG)


@pytest.mark.parametrize("given", VARIANTS, ids=str)
def test_cache_after_prefill_is_the_spec_layout(given):
    layer = make(dtype=torch.bfloat16, **given)
    _, entry = decode(layer, torch.randn(2, 6, CFG.dim, dtype=torch.bfloat16), 5)
    spec = lookup(KIND).cache(resolved(CFG, **given), CFG, 2, 6)
    assert {k: (tuple(t.shape), t.dtype) for k, t in entry.items()} == {
        k: (c.shape, DTYPES[c.dtype]) for k, c in spec.items()
    }


@pytest.mark.parametrize("given", VARIANTS, ids=str)
@pytest.mark.parametrize("T, n", [(9, 1), (9, 6), (70, 66)])
def test_prefill_then_decode_equals_one_forward(given, T, n):
    layer = make(**given)
    x = torch.randn(2, T, CFG.dim, dtype=torch.float64)
    y, _ = decode(layer, x, n)
    torch.testing.assert_close(y, layer(x), rtol=1e-9, atol=1e-11)


def rotate(x: torch.Tensor, start: int) -> torch.Tensor:
    """mixers.md §2(a): pair (2j, 2j+1) of `x [B, T, H, K]` turned by n·θ_j, θ_j = 10000^(−j/(K/2−1))."""
    K = x.shape[-1]
    y = torch.empty_like(x)
    for t in range(x.shape[1]):
        for j in range(K // 2):
            a = (start + t) * 10000.0 ** (-j / (K / 2 - 1))
            x0, x1 = x[:, t, :, 2 * j], x[:, t, :, 2 * j + 1]
            y[:, t, :, 2 * j] = x0 * math.cos(a) - x1 * math.sin(a)
            y[:, t, :, 2 * j + 1] = x0 * math.sin(a) + x1 * math.cos(a)
    return y


def recurrence(layer: MultiScaleRetention, x: torch.Tensor, start: int = 0) -> torch.Tensor:
    """mixers.md §2(b), token by token: S_t = γ_h S_{t−1} + k̃_t v_tᵀ, γ_h = 1 − 2^(−5−h)."""
    p, H, K, V = dict(layer.named_parameters()), layer.H, layer.K, layer.V
    B, T, _ = x.shape
    q = rotate((x @ p["q_proj.weight"].T).view(B, T, H, K), start)
    k = rotate((x @ p["k_proj.weight"].T).view(B, T, H, K), start) * K**-0.5
    v = (x @ p["v_proj.weight"].T).view(B, T, H, V)
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(H)], dtype=x.dtype)[None, :, None, None]
    S = torch.zeros(B, H, K, V, dtype=x.dtype)
    outs = []
    for t in range(T):
        S = gamma * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    y = torch.stack(outs, dim=1)  # [B, T, H, V]
    y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * p["g_norm.weight"]
    y = y * F.silu((x @ p["g_proj.weight"].T).view(B, T, H, V))
    return y.reshape(B, T, H * V) @ p["o_proj.weight"].T


@pytest.mark.parametrize("given", VARIANTS, ids=str)
def test_layer_equals_the_recurrence_of_the_sheet(given):
    layer = make(**given)
    x = torch.randn(2, 7, CFG.dim, dtype=torch.float64)
    torch.testing.assert_close(layer(x), recurrence(layer, x), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("pos", [0, 5, 1000])
def test_rotation_turns_pairs_at_absolute_positions(pos):
    """The layer's leaf against the sheet's formula (scores only see t − s, so a wrong offset
    would show only in decode, which the decode test covers)."""
    x = torch.randn(2, 4, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(xpos_rotate(x, pos), rotate(x, pos), rtol=1e-12, atol=1e-12)


def test_odd_head_dim_is_refused():
    with pytest.raises(ValueError, match="even"):
        MultiScaleRetention(resolved(CFG, head_dim=7), CFG)


def test_gradcheck_through_the_layer():
    layer = make(TINY)
    names = ("q_proj.weight", "g_norm.weight")
    params = tuple(dict(layer.named_parameters())[n].detach().clone().requires_grad_(True) for n in names)
    x = torch.randn(1, 3, TINY.dim, dtype=torch.float64, requires_grad=True)

    def f(x, *ps):
        return functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


def test_traced_graph_has_one_core_node_and_decodes():
    layer = make()
    gm = torch.fx.symbolic_trace(layer)
    cores = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__.endswith("_core")]
    assert [n.target.__name__ for n in cores] == ["simple_gla_core"]
    x = torch.randn(2, 9, CFG.dim, dtype=torch.float64)
    y, _ = decode(gm, x, 5)
    torch.testing.assert_close(y, layer(x), rtol=1e-9, atol=1e-11)


def test_initialisation_and_decays_survive_a_bf16_cast():
    torch.manual_seed(0)
    layer = MultiScaleRetention(resolved(CFG, heads=8, head_dim=4), CFG).to(torch.bfloat16)
    assert torch.equal(layer.g_norm.weight, torch.ones(layer.V, dtype=torch.bfloat16))
    # the decays are rebuilt in fp32 from the head index, not rounded through bf16
    assert layer.head_index.dtype == torch.long and torch.equal(layer.head_index, torch.arange(8))


@pytest.mark.parametrize(
    "x, match",
    [
        (torch.randn(4, CFG.dim, dtype=torch.float64), r"\[B, T, D\]"),
        (torch.randn(1, 4, CFG.dim + 1, dtype=torch.float64), "D = 32"),
        (torch.ones(1, 4, CFG.dim, dtype=torch.long), "floating-point"),
        (torch.randn(1, 4, CFG.dim, dtype=torch.float32), "torch.float64"),
    ],
    ids=["rank", "dim", "integer", "dtype"],
)
def test_bad_input_raises_value_error(x, match):
    with pytest.raises(ValueError, match=match):
        make()(x)
