"""`mlstm` layer (lt2dsl.lowering.layers.mlstm): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from lt2dsl.ir.nodes import MlpSpec, ModelConfig, NormSpec
from lt2dsl.ir.registry import lookup
from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.layers.mlstm import MLSTM

KIND = "mlstm"


def config(dim: int, heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(dim=dim, heads=heads, head_dim=head_dim, kv_heads=heads, mlp=MlpSpec(type="none"),
                       norm=NormSpec(), vocab=64)


CFG, TINY = config(32, 2, 8), config(8, 2, 4)
VARIANTS = [{}, {"qk_dim_factor": 1}, {"gate_cap": 2.0}]
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


def make(cfg: ModelConfig = CFG, dtype=torch.float64, **given) -> MLSTM:
    """A layer with every parameter moved off its init, so gates, norms and convs all matter."""
    torch.manual_seed(0)
    layer = MLSTM(resolved(cfg, **given), cfg).to(dtype)
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


def recurrence(layer: MLSTM, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """mixers.md §8(b), the stabilised recurrence token by token (k̄ = k/√K, C_0 = n_0 = m_0 = 0)."""
    p, H, K, V = dict(layer.named_parameters()), layer.H, layer.K, layer.V
    B, T, _ = x.shape
    cap = float(layer.opts["gate_cap"])
    q = (x @ p["q_proj.weight"].T).view(B, T, H, K)
    k = (x @ p["k_proj.weight"].T).view(B, T, H, K) / math.sqrt(K)
    v = (x @ p["v_proj.weight"].T).view(B, T, H, V)
    i_pre = cap * torch.tanh((x @ p["igate.weight"].T + p["igate.bias"]) / cap)
    logf = F.logsigmoid(cap * torch.tanh((x @ p["fgate.weight"].T + p["fgate.bias"]) / cap))
    C, n = torch.zeros(B, H, K, V, dtype=x.dtype), torch.zeros(B, H, K, dtype=x.dtype)
    m = torch.zeros(B, H, dtype=x.dtype)
    hs = []
    for t in range(T):
        m_new = torch.maximum(logf[:, t] + m, i_pre[:, t])
        i_s, f_s = torch.exp(i_pre[:, t] - m_new), torch.exp(logf[:, t] + m - m_new)
        C = f_s[..., None, None] * C + i_s[..., None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
        n = f_s[..., None] * n + i_s[..., None] * k[:, t]
        m = m_new
        num = torch.einsum("bhkv,bhk->bhv", C, q[:, t])
        den = torch.maximum((n * q[:, t]).sum(-1).abs(), torch.exp(-m)) + eps
        hs.append(num / den[..., None])
    h = torch.stack(hs, dim=1)  # [B, T, H, V]
    h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-6)
    h = h.reshape(B, T, H * V) * p["norm.weight"]
    return (torch.sigmoid(x @ p["ogate.weight"].T) * h) @ p["out_proj.weight"].T


@pytest.mark.parametrize("given", VARIANTS, ids=str)
def test_layer_equals_the_recurrence_of_the_sheet(given):
    layer = make(**given)
    x = torch.randn(2, 7, CFG.dim, dtype=torch.float64)
    torch.testing.assert_close(layer(x), recurrence(layer, x), rtol=1e-9, atol=1e-11)


def test_decode_updates_the_cached_state_in_place_without_autograd():
    layer = make()
    x = torch.randn(2, 6, CFG.dim, dtype=torch.float64)
    with torch.no_grad():
        _, entry = decode(layer, x[:, :5], 4)
        states = [entry[n] for n in ("C", "n", "m")]
        layer(x[:, 5:], entry, 5)
    assert all(entry[n] is s for n, s in zip(("C", "n", "m"), states))


def test_gate_soft_cap_bounds_the_pre_activations():
    """Large gate weights: outputs still match the sheet, whose gates pass cap·tanh(·/cap)."""
    layer = make(gate_cap=2.0)
    with torch.no_grad():
        layer.igate.weight.mul_(50)
        layer.fgate.weight.mul_(50)
    x = torch.randn(2, 7, CFG.dim, dtype=torch.float64)
    torch.testing.assert_close(layer(x), recurrence(layer, x), rtol=1e-9, atol=1e-11)


def test_gradcheck_through_the_layer():
    layer = make(TINY)
    names = ("igate.bias", "fgate.weight", "norm.weight", "ogate.weight")
    params = tuple(dict(layer.named_parameters())[n].detach().clone().requires_grad_(True) for n in names)
    x = torch.randn(1, 3, TINY.dim, dtype=torch.float64, requires_grad=True)

    def f(x, *ps):
        return functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


def test_traced_graph_has_one_core_node_and_decodes():
    layer = make()
    gm = torch.fx.symbolic_trace(layer)
    cores = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__.endswith("_core")]
    assert [n.target.__name__ for n in cores] == ["mlstm_core"]
    x = torch.randn(2, 9, CFG.dim, dtype=torch.float64)
    y, _ = decode(gm, x, 5)
    torch.testing.assert_close(y, layer(x), rtol=1e-9, atol=1e-11)


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = MLSTM(resolved(CFG, heads=64, head_dim=2), CFG)
    assert torch.equal(layer.igate.weight, torch.zeros(64, CFG.dim))
    assert torch.equal(layer.fgate.weight, torch.zeros(64, CFG.dim))
    torch.testing.assert_close(layer.fgate.bias, torch.linspace(3, 6, 64))
    assert 0.05 < layer.igate.bias.std() < 0.2 and abs(layer.igate.bias.mean()) < 0.05  # N(0, 0.1²)
    assert torch.equal(layer.norm.weight, torch.ones(128))


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
