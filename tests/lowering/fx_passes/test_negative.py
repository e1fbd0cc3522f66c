"""Negative cases: each rule on a hand-built graph where its pattern is present except that an
intermediate has another user (or the pattern is otherwise broken) fires nothing and leaves the
graph unchanged; the same graph without the extra user fuses (so the decline is due to it).
After Inductor's `_test_pattern_fails_with_reuse`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lt2dsl.lowering import functional
from lt2dsl.lowering import functional_recurrent as fr
from lt2dsl.lowering.fx_passes import COUNTERS, fuse

from .helpers import assert_same, check_unchanged, trace

D, H, K, HV = 8, 2, 4, 2
f64 = torch.float64


class AddNorm(nn.Module):
    """s = x + r normalised by two norms (reuse=True) or by one, the sum read again."""

    def __init__(self, reuse: bool):
        super().__init__()
        self.reuse = reuse
        self.n1, self.n2 = nn.RMSNorm(D, eps=1e-6), nn.RMSNorm(D, eps=1e-6)

    def forward(self, x, r):
        s = x + r
        return self.n1(s) + (self.n2(s) if self.reuse else s)


class NormAddNorm(nn.Module):
    """A sandwich add: s = x + n1(r) normalised by n2; reuse=True also reads n1(r)."""

    def __init__(self, reuse: bool):
        super().__init__()
        self.reuse = reuse
        self.n1, self.n2 = nn.RMSNorm(D, eps=1e-6), nn.RMSNorm(D, eps=1e-5)

    def forward(self, x, r):
        b = self.n1(r)
        s = x + b
        return self.n2(s) + s + (b if self.reuse else 0.0)


class NormProj(nn.Module):
    """n = norm(x) read by two projections, and by a sum (reuse=True)."""

    def __init__(self, reuse: bool):
        super().__init__()
        self.reuse = reuse
        self.norm = nn.RMSNorm(D)
        self.q, self.k = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)

    def forward(self, x, r):
        n = self.norm(x + r)
        out = self.q(n) * self.k(n)
        return out + n.sum(-1, keepdim=True) if self.reuse else out


class Swiglu(nn.Module):
    def __init__(self, reuse: bool):
        super().__init__()
        self.reuse = reuse
        self.gate, self.up = nn.Linear(D, 16, bias=False), nn.Linear(D, 16, bias=False)

    def forward(self, x, r):
        a = F.silu(self.gate(x))
        h = a * self.up(r)
        return h + a if self.reuse else h


def _qkv(x):
    return x[..., :K].unflatten(-1, (1, K)).expand(-1, -1, H, K), x[..., K:].unflatten(-1, (1, K)).expand(
        -1, -1, HV, K
    )


class Gates(nn.Module):
    """GDN's gate chain feeding the core; reuse=True also returns softplus(a + dt_bias)."""

    def __init__(self, reuse: bool):
        super().__init__()
        self.reuse = reuse
        self.a_proj, self.b_proj = nn.Linear(D, HV, bias=False), nn.Linear(D, HV, bias=False)
        self.A_log, self.dt_bias = nn.Parameter(torch.rand(HV)), nn.Parameter(torch.randn(HV))

    def forward(self, x, r):
        q, v = _qkv(F.normalize(x, dim=-1))
        sp = F.softplus(self.a_proj(r).to(f64) + self.dt_bias.to(f64))
        g = -self.A_log.to(f64).exp() * sp
        beta = torch.sigmoid(self.b_proj(r).to(f64))
        o = fr.gated_delta_rule_core(q, q, v, g, beta, None, scale=0.5, backend="reference", state_dtype=f64)
        o = o.flatten(-2)
        return o + sp.sum(-1, keepdim=True) if self.reuse else o


class ConvL2(nn.Module):
    """q, k short convs feeding a delta core; reuse=True also reads the q conv output."""

    def __init__(self, reuse: bool):
        super().__init__()
        self.reuse = reuse
        self.q_conv1d = nn.Conv1d(H * K, H * K, 4, groups=H * K, bias=False)
        self.k_conv1d = nn.Conv1d(H * K, H * K, 4, groups=H * K, bias=False)

    def forward(self, x, r):
        qc = functional.short_conv(x, self.q_conv1d.weight, None, None, "q_conv")
        kc = functional.short_conv(r, self.k_conv1d.weight, None, None, "k_conv")
        q, k = qc.unflatten(-1, (H, K)), kc.unflatten(-1, (H, K))
        v = (x * r).unflatten(-1, (H, K))
        beta = torch.sigmoid(x[..., :H])
        o = fr.delta_rule_core(q, k, v, beta, None, scale=0.5, backend="reference", state_dtype=f64)
        o = o.flatten(-2)
        return o + qc if self.reuse else o


class Conv(nn.Module):
    """A short conv with SiLU, or without an activation (reuse=True: the pattern is absent)."""

    def __init__(self, reuse: bool):
        super().__init__()
        self.act = "none" if reuse else "silu"
        self.conv1d = nn.Conv1d(D, D, 4, groups=D, bias=True)

    def forward(self, x, r):
        return functional.short_conv(x + r, self.conv1d.weight, self.conv1d.bias, None, "xbc_conv", self.act)


class OutNorm(nn.Module):
    """GatedRMSNorm → flatten → o_proj; reuse=True also reads the normed output."""

    def __init__(self, reuse: bool):
        super().__init__()
        self.reuse = reuse
        self.o_norm = fr.GatedRMSNorm(K, eps=1e-5, act="silu")
        self.o_proj = nn.Linear(H * K, D, bias=False)

    def forward(self, x, r):
        y = self.o_norm(x.unflatten(-1, (H, K)), r.unflatten(-1, (H, K)))
        out = self.o_proj(y.flatten(-2))
        return out + y.flatten(-2) if self.reuse else out


CASES = {
    "add_rmsnorm": AddNorm,
    "norm_add_rmsnorm": NormAddNorm,
    "norm_proj": NormProj,
    "swiglu": Swiglu,
    "gdn_gate": Gates,
    "conv_silu_l2norm": ConvL2,
    "conv_silu": Conv,
    "gated_norm_proj": OutNorm,
}


def _build(cls, reuse: bool):
    torch.manual_seed(0)
    module = cls(reuse).to(f64)
    g = torch.Generator().manual_seed(1)
    args = (torch.randn(2, 7, D, generator=g, dtype=f64), torch.randn(2, 7, D, generator=g, dtype=f64))
    return module, trace(module), args


@pytest.mark.parametrize("rule", list(CASES))
def test_intermediate_with_another_user_is_not_fused(rule):
    _, gm, args = _build(CASES[rule], reuse=True)
    before = gm(*args)
    check_unchanged(gm, rule)
    torch.testing.assert_close(gm(*args), before, rtol=0, atol=0)


@pytest.mark.parametrize("rule", list(CASES))
def test_same_graph_without_the_extra_user_fuses(rule):
    module, gm, args = _build(CASES[rule], reuse=False)
    unfused = trace(module)
    fuse(gm, rules=[rule])
    assert COUNTERS[rule] >= 1
    assert_same(unfused, gm, list(module.parameters()), *args)


def test_all_rules_on_the_reuse_graphs_keep_the_numbers():
    """Whatever else fires around a declined pattern, the outputs stay the unfused ones."""
    for cls in CASES.values():
        module, gm, args = _build(cls, reuse=True)
        unfused = trace(module)
        fuse(gm)
        assert_same(unfused, gm, list(module.parameters()), *args)
