"""`gdn` layer (lt2dsl.lowering.layers.gdn): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lt2dsl.lowering.layers.gdn import GatedDeltaNet
from tests.lowering.layers.contract import CFG, DecodesStateInPlace, RecurrentContract, conv_silu_ref, l2norm


def recurrence(layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
    """mixers.md §5(b), token by token: S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ."""
    p, o = dict(layer.named_parameters()), layer.opts
    H, HV, K, V = layer.H, layer.HV, layer.K, layer.V
    B, T, _ = x.shape

    def conv(name):
        return conv_silu_ref(x @ p[f"{name}_proj.weight"].T, p.get(f"{name}_conv1d.weight"))

    q = l2norm(conv("q").view(B, T, H, K)).repeat_interleave(HV // H, dim=2)
    k = l2norm(conv("k").view(B, T, H, K)).repeat_interleave(HV // H, dim=2)
    v = conv("v").view(B, T, HV, V)
    alpha = torch.exp(-p["A_log"].exp() * F.softplus(x @ p["a_proj.weight"].T + p["dt_bias"]))
    beta = torch.sigmoid(x @ p["b_proj.weight"].T) * (2.0 if o["neg_eigval"] else 1.0)
    S = torch.zeros(B, HV, K, V, dtype=x.dtype)
    eye = torch.eye(K, dtype=x.dtype)
    outs = []
    for t in range(T):
        kt, bt = k[:, t], beta[:, t, :, None, None]
        house = eye - bt * kt[..., :, None] * kt[..., None, :]
        S = alpha[:, t, :, None, None] * house @ S + bt * kt[..., :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * K**-0.5))
    y = torch.stack(outs, dim=1)  # [B, T, HV, V]
    y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * p["o_norm.weight"]
    if o["gate"]:
        y = y * F.silu((x @ p["g_proj.weight"].T).view(B, T, HV, V))
    return y.reshape(B, T, HV * V) @ p["o_proj.weight"].T


class TestGdn(RecurrentContract, DecodesStateInPlace):
    KIND, CLS, CORE = "gdn", GatedDeltaNet, "gated_delta_rule_core"
    VARIANTS = (
        {},
        {"v_heads": 4, "expand_v": 1},
        {"neg_eigval": True},
        {"gate": False, "conv": 0},
        {"conv": 2},
    )
    GRADCHECK = (({"neg_eigval": True}, ("A_log", "dt_bias", "b_proj.weight")),)
    STATE_NAMES = ("state",)
    truth = staticmethod(recurrence)


resolved = TestGdn.resolved


def memory(layer: GatedDeltaNet) -> torch.Tensor:
    """Tokens each value head keeps its state for at init (a = 0): 1 / (A · softplus(dt_bias))."""
    return 1.0 / (layer.A_log.exp() * F.softplus(layer.dt_bias))


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = GatedDeltaNet(resolved(CFG, v_heads=64, heads=2), CFG)
    A = layer.A_log.exp()
    dt = F.softplus(layer.dt_bias)
    assert A.min() > 0 and A.max() <= 16 and A.std() > 2  # U(0, 16)
    assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6 and dt.min() < 1e-2 < dt.max()
    assert torch.equal(layer.o_norm.weight, torch.ones(layer.V))
    assert abs(layer.q_proj.weight.std().item() - 0.02) < 0.005


def test_dt_max_sets_how_long_the_state_lasts_at_init():
    """fla's dt range leaves most heads a memory of a few tokens; `dt_max` scales the range (same
    draws), and with dt_max = 1e-3 no head forgets within 62 tokens (A ≤ 16, dt ≤ 1e-3)."""
    torch.manual_seed(0)
    fla = GatedDeltaNet(resolved(CFG, v_heads=64, heads=2), CFG)
    torch.manual_seed(0)
    long = GatedDeltaNet(resolved(CFG, v_heads=64, heads=2, dt_max=1e-3), CFG)
    dt = F.softplus(long.dt_bias)
    assert dt.min() >= 1e-5 * (1 - 1e-4) and dt.max() <= 1e-3 * (1 + 1e-4) and dt.min() < 1e-4 < dt.max()
    torch.testing.assert_close(memory(long), 100 * memory(fla), rtol=1e-3, atol=0)
    assert memory(long).min() >= 62
    assert (memory(fla) < 62).float().mean() > 0.5
