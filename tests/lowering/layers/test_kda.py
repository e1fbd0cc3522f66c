"""`kda` layer (lt2dsl.lowering.layers.kda): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import lt2dsl.lowering.layers.kda as mod
from lt2dsl.lowering.layers.kda import KimiDeltaAttention
from tests.lowering.layers.contract import CFG, RecurrentContract, conv_silu_ref, l2norm


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


class TestKda(RecurrentContract):
    KIND, CLS, CORE = "kda", KimiDeltaAttention, "kda_core"
    VARIANTS = ({}, {"v_heads": 4}, {"safe_gate": True}, {"safe_gate": True, "lower_bound": -2.0, "conv": 0})
    GRADCHECK = tuple(
        (given, ("A_log", "dt_bias", "f_proj.1.weight", "g_proj.1.bias"))
        for given in ({}, {"safe_gate": True})
    )
    truth = staticmethod(recurrence)


make, resolved = TestKda.make, TestKda.resolved


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


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = KimiDeltaAttention(resolved(CFG, heads=2, v_heads=64), CFG)
    A, dt = layer.A_log.exp(), F.softplus(layer.dt_bias)
    assert A.min() >= 1 and A.max() <= 16 and A.std() > 2  # U(1, 16)
    assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6 and dt.min() < 1e-2 < dt.max()
    assert torch.equal(layer.g_proj[1].bias, torch.zeros(64 * layer.K))
    safe = KimiDeltaAttention(resolved(CFG, safe_gate=True), CFG)
    assert torch.equal(safe.A_log, torch.zeros(2))  # A_log = 0 with safe_gate (mixers.md §6(a))
