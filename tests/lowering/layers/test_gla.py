"""`gla` layer (lt2dsl.lowering.layers.gla): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lt2dsl.lowering.layers.gla import GatedLinearAttention
from tests.lowering.layers.contract import CFG, RecurrentContract


def recurrence(layer: GatedLinearAttention, x: torch.Tensor) -> torch.Tensor:
    """mixers.md §3(b), token by token: S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ, log α = logσ(gk)/τ."""
    p, H, K, V = dict(layer.named_parameters()), layer.H, layer.K, layer.V
    B, T, _ = x.shape
    q = (x @ p["q_proj.weight"].T).view(B, T, H, K)
    k = (x @ p["k_proj.weight"].T).view(B, T, H, K)
    v = (x @ p["v_proj.weight"].T).view(B, T, H, V)
    gk = x @ p["gk_proj.0.weight"].T @ p["gk_proj.1.weight"].T + p["gk_proj.1.bias"]
    alpha = torch.sigmoid(gk).pow(1.0 / layer.opts["gate_norm"]).view(B, T, H, K)
    S = torch.zeros(B, H, K, V, dtype=x.dtype)
    outs = []
    for t in range(T):
        S = alpha[:, t, :, :, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * K**-0.5))
    y = torch.stack(outs, dim=1)  # [B, T, H, V]
    y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * p["g_norm.weight"]
    y = y * F.silu((x @ p["g_proj.weight"].T).view(B, T, H, V))
    return y.reshape(B, T, H * V) @ p["o_proj.weight"].T


class TestGla(RecurrentContract):
    KIND, CLS, CORE = "gla", GatedLinearAttention, "gla_core"
    VARIANTS = ({}, {"expand_k": 1, "gate_rank": 4, "gate_norm": 4}, {"heads": 4, "head_dim": 4})
    GRADCHECK = (({"gate_rank": 2}, ("gk_proj.0.weight", "gk_proj.1.bias", "g_norm.weight")),)
    truth = staticmethod(recurrence)


resolved = TestGla.resolved


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = GatedLinearAttention(resolved(CFG), CFG)
    assert torch.equal(layer.gk_proj[1].bias, torch.zeros(layer.H * layer.K))
    assert torch.equal(layer.g_norm.weight, torch.ones(layer.V))
    assert abs(layer.q_proj.weight.std().item() - 0.02) < 0.005
