"""`retnet`: multi-scale retention with fixed per-head decays (mixers.md §2)."""

from __future__ import annotations

import torch

from lt2dsl.ir.specs.retnet import dims
from lt2dsl.lowering.functional_recurrent import (
    GatedRMSNorm,
    init_linears,
    math_dtype,
    simple_gla_core,
    xpos_rotate_qk,
)
from lt2dsl.lowering.layers.base import MixerLayer, linear


class MultiScaleRetention(MixerLayer):
    """Retention: linear attention with a fixed decay per head and an xPos-style rotation.

    x `[B, T, D]` → q, k `[B, T, H, K]` rotated in interleaved pairs at their absolute positions
    (`pos` onward, from 0), v `[B, T, H, V]` (V = K · expand_v); S_t = γ_h S_{t−1} + k̃_t v_tᵀ,
    o_t = S_tᵀ (K^-½ q̃_t) (torchscale scales k instead: the same product); then per-head
    RMSNorm(o) ⊙ SiLU(W_g x) (affine, eps 1e-5, as fla's fused gated norm) and W_o. torchscale's
    per-row decay/score rescalings are omitted: the per-head norm removes them (up to its eps),
    as mixers.md §2(b) allows. No mixer-specific parameters; projections normal(0, 0.02).
    """

    kind = "retnet"

    def __init__(self, opts, cfg, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        H, K, V = dims(self.opts)
        self.head_projections(H, K, V)
        self.g_proj, self.o_proj = linear(cfg.dim, H * V), linear(H * V, cfg.dim)
        self.g_norm = GatedRMSNorm(V, eps=1e-5, act="silu")
        # head index h of γ_h = 1 − 2^(−5−h): an integer buffer follows .to(device) but not a
        # cast to bf16, which would round γ (up to 1 − 2^−12) too coarsely
        self.register_buffer("head_index", torch.arange(H), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears(self)

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` holds `state` `[B, H, K, V]`; x[:, 0] sits at `pos`."""
        self.check(x)
        q = self.q_proj(x).unflatten(-1, (self.H, self.K))
        k = self.k_proj(x).unflatten(-1, (self.H, self.K))
        q, k = xpos_rotate_qk(q, k, pos, cu_seqlens, backend=self.backend)
        v = self.v_proj(x).unflatten(-1, (self.H, self.V))
        log_decay = torch.log1p(-torch.exp2(-5.0 - self.head_index.to(math_dtype(self))))
        g = log_decay.expand_as(v[..., 0])  # [B, T, H]
        o = simple_gla_core(q, k, v, g, entry, scale=self.K**-0.5, **self.core_kwargs(cu_seqlens))
        gate = self.g_proj(x).unflatten(-1, (self.H, self.V))
        return self.o_proj(self.g_norm(o, gate).flatten(-2))
