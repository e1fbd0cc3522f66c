"""`deltanet` layer (lt2dsl.lowering.layers.deltanet): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from lt2dsl.lowering.layers.deltanet import DeltaNet
from tests.lowering.layers.contract import CFG, RecurrentContract, conv_silu_ref, l2norm


def recurrence(layer: DeltaNet, x: torch.Tensor) -> torch.Tensor:
    """mixers.md §4(b), token by token: S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ."""
    p, H, K = dict(layer.named_parameters()), layer.H, layer.K
    B, T, _ = x.shape

    def conv(name):
        return conv_silu_ref(x @ p[f"{name}_proj.weight"].T, p.get(f"{name}_conv1d.weight")).view(B, T, H, K)

    q, k, v = l2norm(conv("q")), l2norm(conv("k")), conv("v")
    beta = torch.sigmoid(x @ p["b_proj.weight"].T)
    S = torch.zeros(B, H, K, K, dtype=x.dtype)
    eye = torch.eye(K, dtype=x.dtype)
    outs = []
    for t in range(T):
        kt, bt = k[:, t], beta[:, t, :, None, None]
        S = (eye - bt * kt[..., :, None] * kt[..., None, :]) @ S + bt * kt[..., :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * K**-0.5))
    y = torch.stack(outs, dim=1)  # [B, T, H, K]
    y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * p["o_norm.weight"]
    if layer.opts["gate"]:
        y = y * F.silu((x @ p["g_proj.weight"].T).view(B, T, H, K))
    return y.reshape(B, T, H * K) @ p["o_proj.weight"].T


class TestDeltaNet(RecurrentContract):
    KIND, CLS, CORE = "deltanet", DeltaNet, "delta_rule_core"
    VARIANTS = ({}, {"gate": True}, {"conv": 0}, {"conv": 3, "gate": True})
    GRADCHECK = (({"gate": True}, ("b_proj.weight", "k_conv1d.weight", "o_norm.weight")),)
    TRACE_GIVEN: ClassVar = {"gate": True}
    truth = staticmethod(recurrence)


resolved = TestDeltaNet.resolved


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = DeltaNet(resolved(CFG, gate=True), CFG)
    assert torch.equal(layer.o_norm.weight, torch.ones(layer.K))
    assert abs(layer.v_proj.weight.std().item() - 0.02) < 0.005
    # PyTorch's Conv1d default (fla's ShortConvolution): U(±1/sqrt(W)) for a depthwise conv
    assert layer.q_conv1d.weight.abs().max() <= 0.5 and layer.q_conv1d.weight.std() > 0.2
