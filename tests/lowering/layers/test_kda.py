"""`kda` layer (lt2dsl.lowering.layers.kda): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

import lt2dsl.lowering.layers.kda as mod
from lt2dsl.ir.nodes import MlpSpec, ModelConfig, NormSpec
from lt2dsl.ir.registry import lookup
from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.layers.kda import KimiDeltaAttention

KIND = "kda"


def config(dim: int, heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(dim=dim, heads=heads, head_dim=head_dim, kv_heads=heads, mlp=MlpSpec(type="none"),
                       norm=NormSpec(), vocab=64)


CFG, TINY = config(32, 2, 8), config(8, 2, 4)
VARIANTS = [{}, {"v_heads": 4}, {"safe_gate": True}, {"safe_gate": True, "lower_bound": -2.0, "conv": 0}]
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


def make(cfg: ModelConfig = CFG, dtype=torch.float64, **given) -> KimiDeltaAttention:
    """A layer with every parameter moved off its init, so gates, norms and convs all matter."""
    torch.manual_seed(0)
    layer = KimiDeltaAttention(resolved(cfg, **given), cfg).to(dtype)
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


def conv_silu_ref(u: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """y_t[c] = SiLU(Σ_j w[c, j] u_{t−W+1+j}[c]) with zeros before the start (mixers.md §0)."""
    if w is None:
        return F.silu(u)
    W, T = w.shape[-1], u.shape[1]
    y = torch.zeros_like(u)
    for t in range(T):
        for j in range(W):
            s = t - W + 1 + j
            if s >= 0:
                y[:, t] += w[:, 0, j] * u[:, s]
    return F.silu(y)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def log_decay(layer: KimiDeltaAttention, x: torch.Tensor) -> torch.Tensor:
    """mixers.md §6(a): g = −exp(A_log)·softplus(f + dt_bias), or lb·σ(exp(A_log)(f + dt_bias))."""
    p, o = dict(layer.named_parameters()), layer.opts
    B, T, _ = x.shape
    f = (x @ p["f_proj.0.weight"].T @ p["f_proj.1.weight"].T + p["dt_bias"]).view(B, T, layer.HV, layer.K)
    A = p["A_log"].exp()[:, None]
    if o["safe_gate"]:
        return o["lower_bound"] * torch.sigmoid(A * f)
    return -A * F.softplus(f)


def recurrence(layer: KimiDeltaAttention, x: torch.Tensor) -> torch.Tensor:
    """mixers.md §6(b), token by token: S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} + β_t k_t v_tᵀ."""
    p, H, HV, K = dict(layer.named_parameters()), layer.H, layer.HV, layer.K
    B, T, _ = x.shape

    def conv(name, heads):
        u = x @ p[f"{name}_proj.weight"].T
        return conv_silu_ref(u, p.get(f"{name}_conv1d.weight")).view(B, T, heads, K)

    q = l2norm(conv("q", H)).repeat_interleave(HV // H, dim=2)
    k = l2norm(conv("k", H)).repeat_interleave(HV // H, dim=2)
    v = conv("v", HV)
    alpha = log_decay(layer, x).exp()  # [B, T, HV, K]
    beta = torch.sigmoid(x @ p["b_proj.weight"].T)
    S = torch.zeros(B, HV, K, K, dtype=x.dtype)
    eye = torch.eye(K, dtype=x.dtype)
    outs = []
    for t in range(T):
        kt, bt = k[:, t], beta[:, t, :, None, None]
        house = eye - bt * kt[..., :, None] * kt[..., None, :]
        S = house @ (alpha[:, t, :, :, None] * S) + bt * kt[..., :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * K**-0.5))
    y = torch.stack(outs, dim=1)  # [B, T, HV, K]
    y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * p["o_norm.weight"]
    gate = (x @ p["g_proj.0.weight"].T) @ p["g_proj.1.weight"].T + p["g_proj.1.bias"]
    y = y * torch.sigmoid(gate.view(B, T, HV, K))
    return y.reshape(B, T, HV * K) @ p["o_proj.weight"].T


@pytest.mark.parametrize("given", VARIANTS, ids=str)
def test_layer_equals_the_recurrence_of_the_sheet(given):
    layer = make(**given)
    x = torch.randn(2, 7, CFG.dim, dtype=torch.float64)
    torch.testing.assert_close(layer(x), recurrence(layer, x), rtol=1e-9, atol=1e-11)


def test_safe_gate_bounds_the_log_decay_the_core_gets(monkeypatch):
    seen = []

    def spy(q, k, v, g, beta, entry, **kw):
        seen.append(g)
        return core(q, k, v, g, beta, entry, **kw)

    core = mod.kda_core
    monkeypatch.setattr(mod, "kda_core", spy)
    layer = make(safe_gate=True, lower_bound=-2.0)
    x = 3 * torch.randn(2, 5, CFG.dim, dtype=torch.float64)
    layer(x)
    torch.testing.assert_close(seen[0], log_decay(layer, x), rtol=1e-12, atol=1e-12)
    assert seen[0].min() >= -2.0 and seen[0].max() <= 0 and seen[0].min() < -1.5


@pytest.mark.parametrize("given", [{}, {"safe_gate": True}], ids=str)
def test_gradcheck_through_the_layer(given):
    layer = make(TINY, **given)
    names = ("A_log", "dt_bias", "f_proj.1.weight", "g_proj.1.bias")
    params = tuple(dict(layer.named_parameters())[n].detach().clone().requires_grad_(True) for n in names)
    x = torch.randn(1, 3, TINY.dim, dtype=torch.float64, requires_grad=True)

    def f(x, *ps):
        return functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


def test_traced_graph_has_one_core_node_and_decodes():
    layer = make()
    gm = torch.fx.symbolic_trace(layer)
    cores = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__.endswith("_core")]
    assert [n.target.__name__ for n in cores] == ["kda_core"]
    x = torch.randn(2, 9, CFG.dim, dtype=torch.float64)
    y, _ = decode(gm, x, 5)
    torch.testing.assert_close(y, layer(x), rtol=1e-9, atol=1e-11)


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = KimiDeltaAttention(resolved(CFG, heads=2, v_heads=64), CFG)
    A, dt = layer.A_log.exp(), F.softplus(layer.dt_bias)
    assert A.min() >= 1 and A.max() <= 16 and A.std() > 2  # U(1, 16)
    assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6 and dt.min() < 1e-2 < dt.max()
    assert torch.equal(layer.g_proj[1].bias, torch.zeros(64 * layer.K))
    safe = KimiDeltaAttention(resolved(CFG, safe_gate=True), CFG)
    assert torch.equal(safe.A_log, torch.zeros(2))  # A_log = 0 with safe_gate (mixers.md §6(a))


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
