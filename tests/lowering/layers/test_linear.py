"""`linear` layer (lt2dsl.lowering.layers.linear): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import torch

from lt2dsl.lowering.layers.linear import LinearAttention
from tests.lowering.layers.contract import CFG, RecurrentContract, RunsUnderAutocast


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


class TestLinear(RecurrentContract, RunsUnderAutocast):
    KIND, CLS, CORE = "linear", LinearAttention, "simple_gla_core"
    VARIANTS = (
        {},
        {"feature_map": "hedgehog"},
        {"feature_map": "relu", "normalize": False},
        {"feature_map": "identity", "normalize": False},
        {"feature_map": "hedgehog", "normalize": False},
    )
    # the default (elu1, normalized) has no feature-map weights and no output norm
    GRADCHECK = (
        ({}, ("q_proj.weight",)),
        (
            {"feature_map": "hedgehog", "normalize": False},
            ("q_proj.weight", "k_fm.weight", "k_fm.bias", "o_norm.weight"),
        ),
    )
    TRACE_GIVEN = AUTOCAST_GIVEN = VARIANTS[1]
    truth = staticmethod(recurrence)


resolved = TestLinear.resolved


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = LinearAttention(resolved(CFG, feature_map="hedgehog", normalize=False), CFG)
    assert torch.equal(layer.q_fm.weight, torch.eye(8).repeat(2, 1, 1))
    assert torch.equal(layer.k_fm.bias, torch.zeros(2, 8))
    assert torch.equal(layer.o_norm.weight, torch.ones(8))
    assert abs(layer.q_proj.weight.std().item() - 0.02) < 0.005
