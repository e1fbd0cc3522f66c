"""`mlstm` layer (lt2dsl.lowering.layers.mlstm): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lt2dsl.lowering.layers.mlstm import MLSTM
from tests.lowering.layers.contract import CFG, DecodesStateInPlace, RecurrentContract


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


class TestMLSTM(RecurrentContract, DecodesStateInPlace):
    KIND, CLS, CORE = "mlstm", MLSTM, "mlstm_core"
    VARIANTS = ({}, {"qk_dim_factor": 1}, {"gate_cap": 2.0})
    GRADCHECK = (({}, ("igate.bias", "fgate.weight", "norm.weight", "ogate.weight")),)
    STATE_NAMES = ("C", "n", "m")
    truth = staticmethod(recurrence)


make, resolved = TestMLSTM.make, TestMLSTM.resolved


def test_gate_soft_cap_bounds_the_pre_activations():
    """Large gate weights: outputs still match the sheet, whose gates pass cap·tanh(·/cap)."""
    layer = make(gate_cap=2.0)
    with torch.no_grad():
        layer.igate.weight.mul_(50)
        layer.fgate.weight.mul_(50)
    x = torch.randn(2, 7, CFG.dim, dtype=torch.float64)
    torch.testing.assert_close(layer(x), recurrence(layer, x), rtol=1e-9, atol=1e-11)


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = MLSTM(resolved(CFG, heads=64, head_dim=2), CFG)
    assert torch.equal(layer.igate.weight, torch.zeros(64, CFG.dim))
    assert torch.equal(layer.fgate.weight, torch.zeros(64, CFG.dim))
    torch.testing.assert_close(layer.fgate.bias, torch.linspace(3, 6, 64))
    assert 0.05 < layer.igate.bias.std() < 0.2 and abs(layer.igate.bias.mean()) < 0.05  # N(0, 0.1²)
    assert torch.equal(layer.norm.weight, torch.ones(128))
