"""`linear` layer (lt2dsl.lowering.layers.linear): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from lt2dsl.ir.nodes import MlpSpec, ModelConfig, NormSpec
from lt2dsl.ir.registry import lookup
from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.layers.linear import LinearAttention

KIND = "linear"


def config(dim: int, heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(dim=dim, heads=heads, head_dim=head_dim, kv_heads=heads, mlp=MlpSpec(type="none"),
                       norm=NormSpec(), vocab=64)


CFG, TINY = config(32, 2, 8), config(8, 2, 4)
VARIANTS = [{}, {"feature_map": "hedgehog"}, {"feature_map": "relu", "normalize": False},
            {"feature_map": "identity", "normalize": False}, {"feature_map": "hedgehog", "normalize": False}]
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


def make(cfg: ModelConfig = CFG, dtype=torch.float64, **given) -> LinearAttention:
    """A layer with every parameter moved off its init, so gates, norms and convs all matter."""
    torch.manual_seed(0)
    layer = LinearAttention(resolved(cfg, **given), cfg).to(dtype)
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


def phi(layer: LinearAttention, x: torch.Tensor, which: str) -> torch.Tensor:
    """mixers.md §1(a) feature maps of `x [B, T, H, K]`."""
    fm = layer.opts["feature_map"]
    if fm == "elu1":
        return torch.where(x > 0, x + 1, torch.exp(x))
    if fm == "relu":
        return x.clamp(min=0)
    if fm == "identity":
        return x
    p = dict(layer.named_parameters())
    z = torch.einsum("hjk,bthk->bthj", p[f"{which}_fm.weight"], x) + p[f"{which}_fm.bias"]
    e = torch.cat([torch.exp(2 * z), torch.exp(-2 * z)], dim=-1)
    return e / e.sum(-1, keepdim=True)


def recurrence(layer: LinearAttention, x: torch.Tensor) -> torch.Tensor:
    """mixers.md §1(b), token by token: S_t = S_{t−1} + k̂_t v_tᵀ, z_t = z_{t−1} + k̂_t."""
    p, H, K, Kf = dict(layer.named_parameters()), layer.H, layer.K, layer.Kf
    B, T, _ = x.shape
    q = phi(layer, (x @ p["q_proj.weight"].T).view(B, T, H, K), "q")
    k = phi(layer, (x @ p["k_proj.weight"].T).view(B, T, H, K), "k")
    v = (x @ p["v_proj.weight"].T).view(B, T, H, K)
    S, z = torch.zeros(B, H, Kf, K, dtype=x.dtype), torch.zeros(B, H, Kf, dtype=x.dtype)
    outs = []
    for t in range(T):
        S = S + k[:, t, :, :, None] * v[:, t, :, None, :]
        z = z + k[:, t]
        num = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
        if layer.opts["normalize"]:
            outs.append(num / ((q[:, t] * z).sum(-1, keepdim=True) + 1e-6))
        else:
            y = num * Kf**-0.5
            outs.append(y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * p["o_norm.weight"])
    return torch.stack(outs, dim=1).reshape(B, T, H * K) @ p["o_proj.weight"].T


@pytest.mark.parametrize("given", VARIANTS, ids=str)
def test_layer_equals_the_recurrence_of_the_sheet(given):
    layer = make(**given)
    x = torch.randn(2, 7, CFG.dim, dtype=torch.float64)
    torch.testing.assert_close(layer(x), recurrence(layer, x), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("given", [{}, {"feature_map": "hedgehog", "normalize": False}], ids=str)
def test_gradcheck_through_the_layer(given):
    layer = make(TINY, **given)
    names = [n for n in ("q_proj.weight", "k_fm.weight", "k_fm.bias", "o_norm.weight")
             if n in dict(layer.named_parameters())]
    params = tuple(dict(layer.named_parameters())[n].detach().clone().requires_grad_(True) for n in names)
    x = torch.randn(1, 3, TINY.dim, dtype=torch.float64, requires_grad=True)

    def f(x, *ps):
        return functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


def test_traced_graph_has_one_core_node_and_decodes():
    layer = make(feature_map="hedgehog")
    gm = torch.fx.symbolic_trace(layer)
    cores = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__.endswith("_core")]
    assert [n.target.__name__ for n in cores] == ["simple_gla_core"]
    x = torch.randn(2, 9, CFG.dim, dtype=torch.float64)
    y, _ = decode(gm, x, 5)
    torch.testing.assert_close(y, layer(x), rtol=1e-9, atol=1e-11)


def test_runs_under_bf16_autocast():
    """Autocast hands the core mixed dtypes unless the layer aligns q, k, v (softmax, dt·x in fp32)."""
    layer = make(feature_map="hedgehog", dtype=torch.float32)
    x = torch.randn(2, 9, CFG.dim)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = decode(layer, x, 5)
    torch.testing.assert_close(y.float(), layer(x), rtol=0.05, atol=0.05)


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = LinearAttention(resolved(CFG, feature_map="hedgehog", normalize=False), CFG)
    assert torch.equal(layer.q_fm.weight, torch.eye(8).repeat(2, 1, 1))
    assert torch.equal(layer.k_fm.bias, torch.zeros(2, 8))
    assert torch.equal(layer.o_norm.weight, torch.ones(8))
    assert abs(layer.q_proj.weight.std().item() - 0.02) < 0.005


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
