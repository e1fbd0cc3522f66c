"""`retnet` layer (lt2dsl.lowering.layers.retnet): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lt2dsl.lowering.functional_recurrent import xpos_rotate
from lt2dsl.lowering.layers.retnet import MultiScaleRetention
from tests.lowering.layers.contract import CFG, RecurrentContract


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


class TestRetNet(RecurrentContract):
    KIND, CLS, CORE = "retnet", MultiScaleRetention, "simple_gla_core"
    VARIANTS = ({}, {"expand_v": 1}, {"heads": 4, "head_dim": 4})
    GRADCHECK = (({}, ("q_proj.weight", "g_norm.weight")),)
    truth = staticmethod(recurrence)


resolved = TestRetNet.resolved


@pytest.mark.parametrize("pos", [0, 5, 1000])
def test_rotation_turns_pairs_at_absolute_positions(pos):
    """The layer's leaf against the sheet's formula (scores only see t − s, so a wrong offset
    would show only in decode, which the decode test covers)."""
    x = torch.randn(2, 4, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(xpos_rotate(x, pos), rotate(x, pos), rtol=1e-12, atol=1e-12)


def test_odd_head_dim_is_refused():
    with pytest.raises(ValueError, match="even"):
        MultiScaleRetention(resolved(CFG, head_dim=7), CFG)


def test_initialisation_and_decays_survive_a_bf16_cast():
    torch.manual_seed(0)
    layer = MultiScaleRetention(resolved(CFG, heads=8, head_dim=4), CFG).to(torch.bfloat16)
    assert torch.equal(layer.g_norm.weight, torch.ones(layer.V, dtype=torch.bfloat16))
    # the decays are rebuilt in fp32 from the head index, not rounded through bf16
    assert layer.head_index.dtype == torch.long and torch.equal(layer.head_index, torch.arange(8))
