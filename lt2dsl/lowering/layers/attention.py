"""`full` and `swa`: softmax attention with RoPE, GQA and the optional SDPA output gate.

Math: mixers.md §12 (full, gated) and §9 (sliding window: key j visible to query t iff
t − w + 1 ≤ j ≤ t, w keys including itself). Per token x `[D]` (the normed block input):

    q = q_proj(x) `[H, d]`, k = k_proj(x), v = v_proj(x) `[HKV, d]`   (biases: `bias`, `qkv_bias`)
    q, k ← RMSNorm_d(q), RMSNorm_d(k)   (`qk_norm`, Qwen3 / Gemma 3: before RoPE; the model norm's
                                         eps, and its (1 + w) form with `offset`)
    q, k ← RoPE(q, t), RoPE(k, t)   half-split pairs (d_i, d_{i+r/2}) of the first r = `rope_dim`
                                    dims (LLaMA / HF `rotate_half`; partial RoPE when r < d), with
                                    the frequencies of `rope_scaling` (`lowering/rope_scaling.py`)
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

from lt2dsl.ir import nodes as n
from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.lowering import functional as lf
from lt2dsl.lowering.layers.base import MixerLayer, linear
from lt2dsl.lowering.norms import make_norm
from lt2dsl.lowering.rope_scaling import rope_scaling_of


def add_projections(layer: nn.Module, D: int, o: dict[str, Any], qk_norm: float | n.NormSpec) -> None:
    """The projections of `full` (module docstring) on `layer`: q/k/v/o (biases with `bias=true`,
    q/k/v only with `qkv_bias=true`), `g_proj` for `gate=sdpa|headwise`, and the per-head q/k norms
    of `qk_norm`: the model norm's kind, eps and offset (a `NormSpec`), or an RMSNorm of that eps."""
    H, HKV, d, bias = o["heads"], o["kv_heads"], o["head_dim"], bool(o["bias"])
    qkv_bias = bias or bool(o.get("qkv_bias", False))
    layer.q_proj = linear(D, H * d, qkv_bias)
    layer.k_proj = linear(D, HKV * d, qkv_bias)
    layer.v_proj = linear(D, HKV * d, qkv_bias)
    layer.o_proj = linear(H * d, D, bias)
    if o["gate"] != "none":
        layer.g_proj = linear(D, H * d if o["gate"] == "sdpa" else H, bias)
    if o["qk_norm"]:
        spec = n.NormSpec(eps=qk_norm) if isinstance(qk_norm, float) else qk_norm
        spec = spec.model_copy(update={"type": "rmsnorm", "sandwich": False})
        layer.q_norm, layer.k_norm = make_norm(spec, d), make_norm(spec, d)


class Attention(MixerLayer):
    """Causal GQA softmax attention (`full`) or its sliding-window form (`swa`, when opts has `window`).

    `forward(x [B, T, D], entry, pos) -> [B, T, D]`; see the module docstring for the math.
    """

    kind: ClassVar[str] = "full"

    @classmethod
    def kind_of(cls, opts: dict[str, Any]) -> str:
        return "swa" if opts.get("window") is not None else "full"

    def __init__(self, opts: dict[str, Any], cfg: ModelConfig, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        o, D = self.opts, cfg.dim
        self.window: int | None = o.get("window")
        self.H, self.HKV, self.d = o["heads"], o["kv_heads"], o["head_dim"]
        self.theta, self.gate = float(o["rope_theta"]), o["gate"]
        self.rope_dim = int(o.get("rope_dim", self.d))
        self.scaling = rope_scaling_of(o)
        add_projections(self, D, o, cfg.norm)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Projections normal(0, 0.02), biases 0, qk-norms 1 (the model rescales o_proj by depth)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif hasattr(m, "reset_parameters") and m is not self:
                m.reset_parameters()

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` (or None) holds `k`, `v` `[B, HKV, L, d]`."""
        q = self.q_proj(x).unflatten(-1, (self.H, self.d))  # [B, T, H, d]
        k = self.k_proj(x).unflatten(-1, (self.HKV, self.d))  # [B, T, HKV, d]
        v = self.v_proj(x).unflatten(-1, (self.HKV, self.d))
        if self.opts["qk_norm"]:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = lf.apply_rope_qk(
            q, k, pos, self.theta, self.scaling, cu_seqlens, dims=self.rope_dim, backend=self.backend
        )
        # The cache layout is [B, HKV, L, d]; the op wants [B, L, HKV, d].
        k = lf.append_cache(entry, "k", k.transpose(1, 2), 2, self.window).transpose(1, 2)
        v = lf.append_cache(entry, "v", v.transpose(1, 2), 2, self.window).transpose(1, 2)
        g = None
        if self.gate == "sdpa":
            g = self.g_proj(x).unflatten(-1, (self.H, self.d))
        elif self.gate == "headwise":
            g = self.g_proj(x)  # [B, T, H]
        o = lf.attention_core(q, k, v, self.window, g, self.backend, pos, cu_seqlens)  # [B, T, H, d]
        return self.o_proj(o.flatten(-2))

    def rope(self, x: torch.Tensor, pos, cu_seqlens=None) -> torch.Tensor:
        """RoPE on the first `rope_dim` dims of each head of x `[B, T, h, d]`, the rest unchanged."""
        return lf.apply_rope(
            x, pos, self.theta, self.scaling, cu_seqlens, dims=self.rope_dim, backend=self.backend
        )
