"""`mamba2` layer (lt2dsl.lowering.layers.mamba2): spec contract, decode, recurrence truth, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lt2dsl.lowering.layers.mamba2 import Mamba2
from tests.lowering.layers.contract import CFG, RecurrentContract, RunsUnderAutocast, conv_silu_ref


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


class TestMamba2(RecurrentContract, RunsUnderAutocast):
    KIND, CLS, CORE = "mamba2", Mamba2, "simple_gla_core"
    VARIANTS = (
        {"head_dim": 16, "state": 8},
        {"head_dim": 16, "state": 8, "groups": 2},
        {"head_dim": 16, "state": 8, "conv": 0},
        {"head_dim": 32, "state": 4, "expand": 1},
    )
    GRADCHECK = (
        ({"head_dim": 4, "state": 2, "groups": 2}, ("A_log", "dt_bias", "D", "conv1d.bias", "norm.weight")),
    )
    TRACE_GIVEN, AUTOCAST_GIVEN = VARIANTS[0], VARIANTS[1]
    truth = staticmethod(recurrence)


resolved = TestMamba2.resolved


def test_inconsistent_heads_are_refused():
    with pytest.raises(ValueError, match="heads"):
        Mamba2(resolved(CFG, head_dim=16, heads=3), CFG)
    with pytest.raises(ValueError, match="groups"):
        Mamba2(resolved(CFG, head_dim=16, groups=3), CFG)


def test_initialisation_follows_the_sheet():
    torch.manual_seed(0)
    layer = Mamba2(resolved(CFG, head_dim=1, state=4), CFG)  # 64 heads for the statistics
    A, dt = layer.A_log.exp(), F.softplus(layer.dt_bias)
    assert A.min() >= 1 and A.max() <= 16 and A.std() > 2  # U(1, 16)
    assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6 and dt.min() < 1e-2 < dt.max()
    assert torch.equal(layer.D, torch.ones(64)) and torch.equal(layer.norm.weight, torch.ones(64))
