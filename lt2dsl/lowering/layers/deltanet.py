"""`deltanet`: the delta rule without decay (mixers.md §4), as fla's `DeltaNet` layer."""

from __future__ import annotations

import torch

from lt2dsl.lowering.functional_recurrent import (
    GatedRMSNorm,
    add_qkv_convs,
    conv_qkv,
    delta_rule_core,
    init_linears,
    math_dtype,
)
from lt2dsl.lowering.layers.base import MixerLayer, linear


class DeltaNet(MixerLayer):
    """Delta rule with L2-normalised keys and a per-head output RMSNorm.

    x `[B, T, D]` → q, k, v `[B, T, H, K]` (K = V) through projections and short convs + SiLU
    (SiLU alone when `conv=0`), q, k L2-normalised inside the core; β = σ(W_b x) `[B, T, H]` in
    fp32; S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ (K^-½ q_t); then per-head
    RMSNorm(o) (⊙ SiLU(W_g x) with `gate`; eps `norm_eps`, fla's norm_eps) and W_o. No parameter
    beyond projections, convs (PyTorch's Conv1d default init, as fla) and the norm weight.
    """

    kind = "deltanet"

    def __init__(self, opts, cfg, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        H, K, W, D = self.opts["heads"], self.opts["head_dim"], self.opts["conv"], cfg.dim
        self.H, self.K, self.W = H, K, W
        self.q_proj, self.k_proj, self.v_proj = linear(D, H * K), linear(D, H * K), linear(D, H * K)
        self.b_proj = linear(D, H)
        if self.opts["gate"]:
            self.g_proj = linear(D, H * K)
        self.o_proj = linear(H * K, D)
        add_qkv_convs(self, H * K, H * K, W)
        self.o_norm = GatedRMSNorm(K, eps=self.opts["norm_eps"], act="silu" if self.opts["gate"] else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears(self)

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` holds `state` `[B, H, K, K]` and the conv buffers."""
        self.check(x)
        q, k, v = conv_qkv(self, x, entry, self.H, self.K, cu_seqlens)
        beta = torch.sigmoid(self.b_proj(x).to(math_dtype(self)))  # [B, T, H]
        o = delta_rule_core(q, k, v, beta, entry, scale=self.K**-0.5, **self.core_kwargs(cu_seqlens))
        gate = self.g_proj(x).unflatten(-1, (self.H, self.K)) if self.opts["gate"] else None
        return self.o_proj(self.o_norm(o, gate).flatten(-2))
