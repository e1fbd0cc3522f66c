"""The mixer-layer contract (lt2dsl/lowering/layers/base.py) as tests every layer file shares.

A test file declares one `Test…` class that subclasses `LayerContract` (or `RecurrentContract`, for
the recurrent kinds) and sets its kind's configuration as class attributes: `KIND`, `CLS`, `CFG`,
`VARIANTS`, …. The contract tests it inherits are parametrized over those attributes by the class's
`pytest_generate_tests`: an argument named `given` runs over `VARIANTS`, `bad` over `BAD_INPUTS`,
`grad` over `GRADCHECK`. `DecodesStateInPlace` and `RunsUnderAutocast` add the checks only some
recurrent kinds make. The file itself keeps only what is particular to its kind: the float64 truth
from mixers.md, the initialisation, special cases.

The helpers here (options as the resolve pass fills them, prefill + decode in pieces, the shared
float64 pieces of the truths, gradcheck over named parameters, fx call targets, the cache layout
against the spec) serve those files too.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from lt2dsl.ir.nodes import MlpSpec, ModelConfig, NormSpec
from lt2dsl.ir.registry import lookup
from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.to_fx import trace
from tests.kernels.utils import assert_close

F64 = torch.float64


# ---- configuration and options ----------------------------------------------------------------------


def model_config(**kw) -> ModelConfig:
    """A mixer-only model (no MLP, vocab 64); `kw` gives dim, heads, head_dim, kv_heads, …."""
    return ModelConfig(**({"vocab": 64, "mlp": MlpSpec(type="none"), "norm": NormSpec()} | kw))


def recurrent_config(dim: int, heads: int, head_dim: int) -> ModelConfig:
    return model_config(dim=dim, heads=heads, head_dim=head_dim, kv_heads=heads)


CFG, TINY = recurrent_config(32, 2, 8), recurrent_config(8, 2, 4)


def resolved(kind: str, cfg: ModelConfig, **given) -> dict:
    """Every option of the kind filled in, as the resolve pass does: the given values, spec defaults
    for the rest."""
    opts: dict = {}
    for o in lookup(kind).options:
        if o.name not in ("mlp", "norm", "name"):
            opts[o.name] = given[o.name] if o.name in given else o.default_for(cfg, given | opts)
    return opts


def seeded_layer(
    cls: type[nn.Module], kind: str, cfg: ModelConfig, given: dict, dtype=F64, seed: int = 0, perturb=None
) -> nn.Module:
    """`cls` built from the resolved options right after torch.manual_seed(seed), cast to dtype, with
    `perturb(name, p)` applied to each parameter without grad (to move the weights off their init)."""
    torch.manual_seed(seed)
    layer = cls(resolved(kind, cfg, **given), cfg).to(dtype)
    if perturb is not None:
        with torch.no_grad():
            for name, p in layer.named_parameters():
                perturb(name, p)
    return layer


# ---- running a layer --------------------------------------------------------------------------------


def run_in_pieces(layer, x: torch.Tensor, pieces: list[int]) -> tuple[torch.Tensor, Entry]:
    """Prefill chunks of the given lengths into a fresh entry, then one token at a time to the end of x."""
    entry, outs, t = Entry(), [], 0
    for n in pieces:
        outs.append(layer(x[:, t : t + n], entry, t))
        t += n
    while t < x.shape[1]:
        outs.append(layer(x[:, t : t + 1], entry, t))
        t += 1
    return torch.cat(outs, dim=1), entry


def decode(layer, x: torch.Tensor, n: int) -> tuple[torch.Tensor, Entry]:
    """Prefill x[:, :n] into a fresh entry, then feed the rest one token at a time."""
    return run_in_pieces(layer, x, [n])


def call_targets(gm: torch.fx.GraphModule) -> list[str]:
    """Names of the functions the traced graph calls, in graph order."""
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"]


def assert_traced_same(gm: torch.fx.GraphModule, layer: nn.Module, x: torch.Tensor, split: int) -> None:
    """The traced graph gives the layer's output, in one forward and in prefill x[:, :split] + decode."""
    assert_close("traced", gm(x), layer(x), 1e-14)
    out, _ = run_in_pieces(gm, x, [split])
    assert_close("traced decode", out, layer(x), 1e-12)


def assert_cache_is_the_spec_layout(kind: str, layer: nn.Module, entry: Entry, batch: int, L: int) -> dict:
    """The entry holds the tensors of the spec's cache after L tokens, by name and shape; returns the
    spec's layout, for the dtype checks of the caller."""
    spec = lookup(kind).cache(layer.opts, layer.cfg, batch, L)
    assert {n: tuple(t.shape) for n, t in entry.items()} == {n: c.shape for n, c in spec.items()}
    return spec


def gradcheck_params(layer: nn.Module, x: torch.Tensor, names, **kw) -> bool:
    """torch.autograd.gradcheck of the layer in x and in the named parameters (the others held fixed)."""
    params = [layer.get_parameter(n).detach().clone().requires_grad_(True) for n in names]

    def f(x, *ps):
        return functional_call(layer, dict(zip(names, ps)), (x,))

    return torch.autograd.gradcheck(f, (x, *params), **kw)


# ---- float64 pieces shared by the truths of mixers.md -----------------------------------------------


def conv_silu_ref(u: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None = None) -> torch.Tensor:
    """y_t[c] = SiLU(b[c] + Σ_j w[c, j] u_{t−W+1+j}[c]) with zeros before the start (mixers.md §0);
    b = 0 when None, and no conv at all (SiLU only) when w is None."""
    if w is None:
        return F.silu(u)
    W, T = w.shape[-1], u.shape[1]
    y = torch.zeros_like(u) if b is None else torch.zeros_like(u) + b
    for t in range(T):
        for j in range(W):
            s = t - W + 1 + j
            if s >= 0:
                y[:, t] += w[:, 0, j] * u[:, s]
    return F.silu(y)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Half-split RoPE of `x [B, T, H, d]` at positions 0..T−1: pair (i, i + d/2) turns by t·θ^{−2i/d}."""
    T, d = x.shape[1], x.shape[-1]
    ang = torch.arange(T, dtype=F64)[:, None] * theta ** (-torch.arange(0, d, 2, dtype=F64) / d)
    c, s = ang.cos()[None, :, None], ang.sin()[None, :, None]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


# ---- the contract -----------------------------------------------------------------------------------


def _cases(cases) -> tuple[list, list[str]]:
    """Values and ids of a table of cases: a dict's keys name its values; a tuple's items are their
    own names."""
    if isinstance(cases, dict):
        return list(cases.values()), list(cases)
    return list(cases), [str(c) for c in cases]


class LayerContract:
    """What every mixer layer keeps: its parameters are the spec's weights, and malformed input is
    refused with a ValueError that says what is wrong."""

    KIND: ClassVar[str]
    CFG: ClassVar[ModelConfig]
    VARIANTS: ClassVar[tuple[dict, ...] | dict[str, dict]]  # option sets the contract runs on
    BAD_GIVEN: ClassVar[dict[str, Any]] = {}  # the options of the layer fed bad input
    # id -> (shape, dtype, the message's pattern); integer dtypes are fed ones, float ones randn
    BAD_INPUTS: ClassVar[dict[str, tuple[tuple[int, ...], torch.dtype, str]]]

    @classmethod
    def make(cls, **given) -> nn.Module:
        """A float64 layer of the kind with the given options and weights off their init."""
        raise NotImplementedError

    def cases(self) -> dict[str, Any]:
        """The tables the contract tests are parametrized over, by argument name."""
        return {"given": self.VARIANTS, "bad": self.BAD_INPUTS}

    def pytest_generate_tests(self, metafunc):
        for arg, cases in self.cases().items():
            if arg in metafunc.fixturenames:
                values, ids = _cases(cases)
                metafunc.parametrize(arg, values, ids=ids)

    def test_parameters_are_the_spec_weights(self, given):
        layer = self.make(**given)
        got = {k: tuple(p.shape) for k, p in layer.named_parameters()}
        assert got == lookup(self.KIND).weights(resolved(self.KIND, self.CFG, **given), self.CFG)

    def test_bad_input_raises_value_error(self, bad):
        shape, dtype, match = bad
        x = torch.randn(shape, dtype=dtype) if dtype.is_floating_point else torch.ones(shape, dtype=dtype)
        with pytest.raises(ValueError, match=match):
            self.make(**self.BAD_GIVEN)(x)


# bad input of the kinds that check it with lowering/functional_sparse.py (dsa, nsa, tmm), at D = 32
SPARSE_BAD_INPUTS = {
    "dim": ((2, 5, 31), F64, r"\[B, T, D=32\]"),
    "rank": ((5, 32), F64, r"\[B, T, D=32\]"),
    "dtype": ((2, 5, 32), torch.float32, "dtype torch.float64"),
    "empty": ((2, 0, 32), F64, "at least one token"),
}
# dtypes of the recurrent kinds' cache tensors by the spec's dtype class, with the default config
CACHE_DTYPES = {"state": torch.float32, "act": torch.bfloat16}
# split points (T, n) of prefill-then-decode: a one-token prefill, a short one, one past a 64-token chunk
SPLITS = ((9, 1), (9, 6), (70, 66))


class RecurrentContract(LayerContract):
    """The contract of a recurrent kind, run in float64 on `CFG` (D = 32) with weights moved off
    their init so gates, norms and convs all matter: spec weights and cache layout, prefill then
    decode = one forward, the layer = its token-by-token recurrence (`truth`), gradcheck on `TINY`,
    one core node in the fx graph, bad input."""

    CLS: ClassVar[type[nn.Module]]
    CFG = CFG
    TINY = TINY
    CORE: ClassVar[str]  # the one `*_core` function the traced graph calls
    TRACE_GIVEN: ClassVar[dict[str, Any]] = {}  # the options of the traced layer
    GRADCHECK: ClassVar[tuple[tuple[dict[str, Any], tuple[str, ...]], ...]]  # (options, parameter names)
    BAD_INPUTS: ClassVar = {
        "rank": ((4, CFG.dim), F64, r"\[B, T, D\]"),
        "dim": ((1, 4, CFG.dim + 1), F64, f"D = {CFG.dim}"),
        "integer": ((1, 4, CFG.dim), torch.long, "floating-point"),
        "dtype": ((1, 4, CFG.dim), torch.float32, "torch.float64"),
    }

    @classmethod
    def make(cls, cfg: ModelConfig | None = None, dtype=F64, **given) -> nn.Module:
        """A layer with every parameter moved off its init, so gates, norms and convs all matter."""

        def perturb(_, p):
            p.add_(0.2 * torch.randn_like(p))

        return seeded_layer(cls.CLS, cls.KIND, cls.CFG if cfg is None else cfg, given, dtype, 0, perturb)

    @classmethod
    def resolved(cls, cfg: ModelConfig, **given) -> dict:
        return resolved(cls.KIND, cfg, **given)

    @staticmethod
    def truth(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The kind's float64 recurrence of mixers.md, token by token."""
        raise NotImplementedError

    def cases(self) -> dict[str, Any]:
        return super().cases() | {"grad": {str(g): (g, names) for g, names in self.GRADCHECK}}

    def test_cache_after_prefill_is_the_spec_layout(self, given):
        layer = self.make(dtype=torch.bfloat16, **given)
        _, entry = decode(layer, torch.randn(2, 6, self.CFG.dim, dtype=torch.bfloat16), 5)
        spec = assert_cache_is_the_spec_layout(self.KIND, layer, entry, 2, 6)
        assert {k: t.dtype for k, t in entry.items()} == {k: CACHE_DTYPES[c.dtype] for k, c in spec.items()}

    @pytest.mark.parametrize("T, n", SPLITS)
    def test_prefill_then_decode_equals_one_forward(self, given, T, n):
        layer = self.make(**given)
        x = torch.randn(2, T, self.CFG.dim, dtype=F64)
        y, _ = decode(layer, x, n)
        torch.testing.assert_close(y, layer(x), rtol=1e-9, atol=1e-11)

    def test_layer_equals_the_recurrence_of_the_sheet(self, given):
        layer = self.make(**given)
        x = torch.randn(2, 7, self.CFG.dim, dtype=F64)
        torch.testing.assert_close(layer(x), self.truth(layer, x), rtol=1e-9, atol=1e-11)

    def test_gradcheck_through_the_layer(self, grad):
        given, names = grad
        layer = self.make(self.TINY, **given)
        x = torch.randn(1, 3, self.TINY.dim, dtype=F64, requires_grad=True)
        assert gradcheck_params(layer, x, names)

    def test_traced_graph_has_one_core_node_and_decodes(self):
        layer = self.make(**self.TRACE_GIVEN)
        gm = trace(layer)
        assert [t for t in call_targets(gm) if t.endswith("_core")] == [self.CORE]
        x = torch.randn(2, 9, self.CFG.dim, dtype=F64)
        y, _ = decode(gm, x, 5)
        torch.testing.assert_close(y, layer(x), rtol=1e-9, atol=1e-11)


class DecodesStateInPlace:
    """For a `RecurrentContract` whose cached states `STATE_NAMES` decode updates in place."""

    STATE_NAMES: ClassVar[tuple[str, ...]]

    def test_decode_updates_the_cached_state_in_place_without_autograd(self):
        assert self.STATE_NAMES
        layer = self.make()
        x = torch.randn(2, 6, self.CFG.dim, dtype=F64)
        with torch.no_grad():
            _, entry = decode(layer, x[:, :5], 4)
            states = {name: entry[name] for name in self.STATE_NAMES}
            layer(x[:, 5:], entry, 5)
        assert all(entry[name] is s for name, s in states.items())
        # with autograd on, the states saved for backward must not be overwritten: new tensors
        before = {name: s.clone() for name, s in states.items()}
        layer(x[:, 5:], entry, 6).sum().backward()
        for name, s in states.items():
            assert entry[name] is not s and torch.equal(s, before[name]), name


class RunsUnderAutocast:
    """For a `RecurrentContract` whose layer (options `AUTOCAST_GIVEN`) decodes under bf16 autocast."""

    AUTOCAST_GIVEN: ClassVar[dict[str, Any]]

    def test_runs_under_bf16_autocast(self):
        """Autocast hands the core mixed dtypes unless the layer aligns q, k, v (softmax, dt·x in fp32)."""
        layer = self.make(**self.AUTOCAST_GIVEN, dtype=torch.float32)
        x = torch.randn(2, 9, self.CFG.dim)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, _ = decode(layer, x, 5)
        torch.testing.assert_close(y.float(), layer(x), rtol=0.05, atol=0.05)
