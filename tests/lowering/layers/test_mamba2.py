"""`mamba2` layer (lt2dsl.lowering.layers.mamba2): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from lt2dsl.ir.nodes import MlpSpec, ModelConfig, NormSpec
from lt2dsl.ir.registry import lookup
from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.layers.mamba2 import Mamba2

KIND = "mamba2"


def config(dim: int, heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(dim=dim, heads=heads, head_dim=head_dim, kv_heads=heads, mlp=MlpSpec(type="none"),
                       norm=NormSpec(), vocab=64)


CFG, TINY = config(32, 2, 8), config(8, 2, 4)
VARIANTS = [{"head_dim": 16, "state": 8}, {"head_dim": 16, "state": 8, "groups": 2},
            {"head_dim": 16, "state": 8, "conv": 0}, {"head_dim": 32, "state": 4, "expand": 1}]
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


def make(cfg: ModelConfig = CFG, dtype=torch.float64, **given) -> Mamba2:
    """A layer with every parameter moved off its init, so gates, norms and convs all matter."""
    torch.manual_seed(0)
    layer = Mamba2(resolved(cfg, **given), cfg).to(dtype)
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


def conv_silu_ref(u: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor:
    """y_t[c] = SiLU(b[c] + Σ_j w[c, j] u_{t−W+1+j}[c]) with zeros before the start (mixers.md §0)."""
    if w is None:
        return F.silu(u)
    W, T = w.shape[-1], u.shape[1]
    y = torch.zeros_like(u) + b
    for t in range(T):
        for j in range(W):
            s = t - W + 1 + j
            if s >= 0:
                y[:, t] += w[:, 0, j] * u[:, s]
    return F.silu(y)


def recurrence(layer: Mamba2, x: torch.Tensor) -> torch.Tensor:
    """mixers.md §7(b), token by token: h_t = exp(dt_t A) h_{t−1} + dt_t x_t B_tᵀ, y_t = h_t C_t + D x_t."""
    p = dict(layer.named_parameters())
    d_in, H, P, N, G = layer.d_in, layer.H, layer.P, layer.N, layer.G
    B_, T, _ = x.shape
    z, xbc, dt = (x @ p["in_proj.weight"].T).split([d_in, d_in + 2 * G * N, H], dim=-1)
    xbc = conv_silu_ref(xbc, p.get("conv1d.weight"), p.get("conv1d.bias"))
    xs, Bm, Cm = xbc.split([d_in, G * N, G * N], dim=-1)
    xs = xs.view(B_, T, H, P)
    Bm = Bm.view(B_, T, G, N).repeat_interleave(H // G, dim=2)  # head h reads group h // (H/G)
    Cm = Cm.view(B_, T, G, N).repeat_interleave(H // G, dim=2)
    dt = F.softplus(dt + p["dt_bias"])  # [B, T, H]
    A = -p["A_log"].exp()
    h = torch.zeros(B_, H, P, N, dtype=x.dtype)
    ys = []
    for t in range(T):
        decay = torch.exp(dt[:, t] * A)[:, :, None, None]
        h = decay * h + dt[:, t, :, None, None] * xs[:, t, :, :, None] * Bm[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", h, Cm[:, t]) + p["D"][:, None] * xs[:, t])
    y = torch.stack(ys, dim=1).reshape(B_, T, d_in) * F.silu(z)
    y = y.view(B_, T, G, d_in // G)
    y = (y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)).reshape(B_, T, d_in) * p["norm.weight"]
    return y @ p["out_proj.weight"].T


@pytest.mark.parametrize("given", VARIANTS, ids=str)
def test_layer_equals_the_recurrence_of_the_sheet(given):
    layer = make(**given)
    x = torch.randn(2, 7, CFG.dim, dtype=torch.float64)
    torch.testing.assert_close(layer(x), recurrence(layer, x), rtol=1e-9, atol=1e-11)


def test_inconsistent_heads_are_refused():
    with pytest.raises(ValueError, match="heads"):
        Mamba2(resolved(CFG, head_dim=16, heads=3), CFG)
    with pytest.raises(ValueError, match="groups"):
        Mamba2(resolved(CFG, head_dim=16, groups=3), CFG)


def test_gradcheck_through_the_layer():
    layer = make(TINY, head_dim=4, state=2, groups=2)
    names = ("A_log", "dt_bias", "D", "conv1d.bias", "norm.weight")
    params = tuple(dict(layer.named_parameters())[n].detach().clone().requires_grad_(True) for n in names)
    x = torch.randn(1, 3, TINY.dim, dtype=torch.float64, requires_grad=True)

    def f(x, *ps):
        return functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


def test_traced_graph_has_one_core_node_and_decodes():
    layer = make(**VARIANTS[0])
    gm = torch.fx.symbolic_trace(layer)
    cores = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__.endswith("_core")]
    assert [n.target.__name__ for n in cores] == ["simple_gla_core"]
    x = torch.randn(2, 9, CFG.dim, dtype=torch.float64)
    y, _ = decode(gm, x, 5)
    torch.testing.assert_close(y, layer(x), rtol=1e-9, atol=1e-11)


def test_runs_under_bf16_autocast():
    """Autocast hands the core mixed dtypes unless the layer aligns q, k, v (softmax, dt·x in fp32)."""
    layer = make(**VARIANTS[1], dtype=torch.float32)
    x = torch.randn(2, 9, CFG.dim)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = decode(layer, x, 5)
    torch.testing.assert_close(y.float(), layer(x), rtol=0.05, atol=0.05)


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = Mamba2(resolved(CFG, head_dim=1, state=4), CFG)  # 64 heads for the statistics
    A, dt = layer.A_log.exp(), F.softplus(layer.dt_bias)
    assert A.min() >= 1 and A.max() <= 16 and A.std() > 2  # U(1, 16)
    assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6 and dt.min() < 1e-2 < dt.max()
    assert torch.equal(layer.D, torch.ones(64)) and torch.equal(layer.norm.weight, torch.ones(64))


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
