"""The `full` / `swa` layer against a direct float64 computation written from the sheet.

mixers.md §9 / §12: q, k, v projections (+ biases), per-head RMSNorm on q and k (`qk_norm`),
half-split RoPE at absolute positions, per-query softmax over the visible keys (window w: keys
t − w + 1 … t), GQA head mapping h → h // G, σ output gate after attention, o_proj.
"""

from __future__ import annotations

import math

import pytest
import torch

from lt2dsl.lowering.cache import Entry

from .util import lower

# q/k norms take the model norm's eps: rmsnorm's default here
QK_NORM_EPS = 1e-6

CASES = {
    "mha": "full",
    "gqa-qknorm-bias-sdpa-gate": "full(heads=4, kv_heads=2, head_dim=8, qk_norm=true, bias=true, gate=sdpa)",
    "swa-headwise-gate": "swa(window=3, heads=4, kv_heads=1, head_dim=8, gate=headwise, rope_theta=500000)",
    "swa-window-1": "swa(window=1)",
}


def layer_of(call: str):
    return lower(call, mlp="none").blocks[0].mixers[0]


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Half-split rotation of x `[T, d]`: pair (i, i + d/2) turns by t · theta^(−2i/d)."""
    d = x.shape[-1]
    inv = torch.tensor([theta ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    x1, x2 = x[:, : d // 2], x[:, d // 2 :]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], dim=-1)


def direct(layer, x: torch.Tensor, pos: int = 0) -> torch.Tensor:
    """x `[B, T, D]` → `[B, T, D]`, one query at a time."""
    P = dict(layer.named_parameters())
    o = layer.opts
    H, HKV, d, w = o["heads"], o["kv_heads"], o["head_dim"], o.get("window")
    B, T, _ = x.shape

    def proj(name):
        y = x @ P[f"{name}.weight"].T
        return y + P[f"{name}.bias"] if f"{name}.bias" in P else y

    q = proj("q_proj").view(B, T, H, d)
    k, v = proj("k_proj").view(B, T, HKV, d), proj("v_proj").view(B, T, HKV, d)
    if o["qk_norm"]:
        q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + QK_NORM_EPS) * P["q_norm.weight"]
        k = k / torch.sqrt((k * k).mean(-1, keepdim=True) + QK_NORM_EPS) * P["k_norm.weight"]
    positions = torch.arange(pos, pos + T)
    g = proj("g_proj") if o["gate"] != "none" else None
    out = torch.zeros(B, T, H, d, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kv = h // (H // HKV)
            qh = rope(q[b, :, h], positions, o["rope_theta"])
            kh = rope(k[b, :, kv], positions, o["rope_theta"])
            for t in range(T):
                lo = 0 if w is None else max(0, t - w + 1)
                s = kh[lo : t + 1] @ qh[t] / math.sqrt(d)
                y = torch.softmax(s, dim=0) @ v[b, lo : t + 1, kv]
                if o["gate"] == "sdpa":
                    y = y * torch.sigmoid(g[b, t].view(H, d)[h])
                elif o["gate"] == "headwise":
                    y = y * torch.sigmoid(g[b, t, h])
                out[b, t, h] = y
    return proj_out(out.flatten(-2), P)


def proj_out(o: torch.Tensor, P) -> torch.Tensor:
    y = o @ P["o_proj.weight"].T
    return y + P["o_proj.bias"] if "o_proj.bias" in P else y


@pytest.mark.parametrize("call", CASES.values(), ids=CASES.keys())
def test_layer_equals_direct_float64_computation(call):
    layer = layer_of(call)
    with torch.no_grad():
        for p in layer.parameters():  # non-trivial biases and norm weights
            p.add_(0.1 * torch.randn_like(p))
        x = torch.randn(2, 7, 32, dtype=torch.float64)
        torch.testing.assert_close(layer(x, None, 0), direct(layer, x), rtol=1e-10, atol=1e-12)
        # RoPE uses absolute positions: an offset changes the result exactly as the sheet says.
        torch.testing.assert_close(layer(x, None, 5), direct(layer, x, pos=5), rtol=1e-10, atol=1e-12)


def test_sliding_window_cache_keeps_the_last_w_rotated_keys():
    layer = layer_of("swa(window=3)")
    entry = Entry()
    x = torch.randn(1, 8, 32, dtype=torch.float64)
    with torch.no_grad():
        layer(x[:, :5], entry, 0)
        assert entry["k"].shape == (1, 2, 3, 16)
        layer(x[:, 5:6], entry, 5)
        k = layer.k_proj(x).view(1, 8, 2, 16)[0, :, 0]
        want = rope(k, torch.arange(8), 10000.0)[3:6]
    torch.testing.assert_close(entry["k"][0, 0], want, rtol=1e-12, atol=1e-12)


def test_gradcheck_through_the_layer():
    layer = layer_of("full(heads=2, kv_heads=1, head_dim=4, qk_norm=true, gate=sdpa)")
    x = torch.randn(1, 4, 32, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: layer(t, None, 0), (x,))


def test_heads_must_be_a_multiple_of_kv_heads():
    from lt2dsl.lowering.layers.attention import Attention

    cfg = lower("full").config
    opts = {
        "heads": 3,
        "kv_heads": 2,
        "head_dim": 8,
        "gate": "none",
        "qk_norm": False,
        "rope_theta": 1e4,
        "bias": False,
    }
    with pytest.raises(ValueError, match=r"multiple of `kv_heads`.*\[E0501\]"):
        Attention(opts, cfg)
