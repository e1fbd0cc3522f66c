"""`full` and `swa`: softmax attention with RoPE, GQA and the optional SDPA output gate.

Math: mixers.md §12 (full, gated) and §9 (sliding window: key j visible to query t iff
t − w + 1 ≤ j ≤ t, w keys including itself). Per token x `[D]` (the normed block input):

    q = q_proj(x) `[H, d]`, k = k_proj(x), v = v_proj(x) `[HKV, d]`   (biases with `bias=true`)
    q, k ← RMSNorm_d(q), RMSNorm_d(k)                                   (`qk_norm`, Qwen3: before RoPE)
    q, k ← RoPE(q, t), RoPE(k, t)   half-split pairs (d_i, d_{i+d/2}), LLaMA / HF `rotate_half`
    o = softmax(d^{-1/2} q Kᵀ + mask) V  per query head, head h reading kv head h // (H / HKV)
    o ← σ(g_proj(x)) ⊙ o     `gate=sdpa` (d gates per head) or `headwise` (one per head), in fp32
    out = o_proj(concat_h o)

Cache per (iteration, block): `k`, `v` `[B, HKV, L, d]` in the compute dtype, keys stored rotated;
`swa` keeps only the last w positions (a ring of the window), as `lt2dsl/ir/specs/swa.py` counts.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.lowering import functional as lf
from lt2dsl.lowering.layers.base import MixerLayer, linear

# Qwen3's q/k RMSNorm epsilon (its rms_norm_eps).
QK_NORM_EPS = 1e-6


def add_projections(layer: nn.Module, D: int, o: dict[str, Any], eps: float) -> None:
    """The projections of `full` (module docstring) on `layer`: q/k/v/o (biases with `bias=true`),
    `g_proj` for `gate=sdpa|headwise`, and the per-head q/k RMSNorms (eps `eps`) of `qk_norm`."""
    H, HKV, d, bias = o["heads"], o["kv_heads"], o["head_dim"], bool(o["bias"])
    layer.q_proj = linear(D, H * d, bias)
    layer.k_proj = linear(D, HKV * d, bias)
    layer.v_proj = linear(D, HKV * d, bias)
    layer.o_proj = linear(H * d, D, bias)
    if o["gate"] != "none":
        layer.g_proj = linear(D, H * d if o["gate"] == "sdpa" else H, bias)
    if o["qk_norm"]:
        layer.q_norm = nn.RMSNorm(d, eps=eps)
        layer.k_norm = nn.RMSNorm(d, eps=eps)


class Attention(MixerLayer):
    """Causal GQA softmax attention (`full`) or its sliding-window form (`swa`, when opts has `window`).

    `forward(x [B, T, D], entry, pos) -> [B, T, D]`; see the module docstring for the math.
    """

    kind: ClassVar[str] = "full"

    def __init__(self, opts: dict[str, Any], cfg: ModelConfig, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        o, D = self.opts, cfg.dim
        self.window: int | None = o.get("window")
        if self.window is not None:
            self.layer_kind = "swa"
        self.H, self.HKV, self.d = o["heads"], o["kv_heads"], o["head_dim"]
        self.theta, self.gate = float(o["rope_theta"]), o["gate"]
        if self.H % self.HKV:
            raise ValueError(f"{self.spec.kind}: heads={self.H} must be a multiple of kv_heads={self.HKV}")
        if self.d % 2:
            raise ValueError(f"{self.spec.kind}: head_dim must be even for RoPE, got {self.d}")
        add_projections(self, D, o, QK_NORM_EPS)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Projections normal(0, 0.02), biases 0, qk-norms 1 (the model rescales o_proj by depth)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.RMSNorm):
                m.reset_parameters()

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` (or None) holds `k`, `v` `[B, HKV, L, d]`."""
        q = self.q_proj(x).unflatten(-1, (self.H, self.d))  # [B, T, H, d]
        k = self.k_proj(x).unflatten(-1, (self.HKV, self.d))  # [B, T, HKV, d]
        v = self.v_proj(x).unflatten(-1, (self.HKV, self.d))
        if self.opts["qk_norm"]:
            q, k = self.q_norm(q), self.k_norm(k)
        q = lf.apply_rope(q, pos, self.theta)
        k = lf.apply_rope(k, pos, self.theta)
        # The cache layout is [B, HKV, L, d]; the op wants [B, L, HKV, d].
        k = lf.append_cache(entry, "k", k.transpose(1, 2), 2, self.window).transpose(1, 2)
        v = lf.append_cache(entry, "v", v.transpose(1, 2), 2, self.window).transpose(1, 2)
        g = None
        if self.gate == "sdpa":
            g = self.g_proj(x).unflatten(-1, (self.H, self.d))
        elif self.gate == "headwise":
            g = self.g_proj(x)  # [B, T, H]
        o = lf.attention_core(q, k, v, self.window, g, self.backend)  # [B, T, H, d]
        return self.o_proj(o.flatten(-2))
