"""`gla`: gated linear attention with a low-rank per-channel decay (mixers.md §3), as fla's GLA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lt2dsl.ir.specs.gla import dims
from lt2dsl.lowering.functional_recurrent import (
    GatedRMSNorm,
    gla_core,
    init_linears,
    math_dtype,
)
from lt2dsl.lowering.layers.base import MixerLayer, linear


class GatedLinearAttention(MixerLayer):
    """Linear attention with a data-dependent per-channel decay and a SiLU-gated output norm.

    x `[B, T, D]` → q, k `[B, T, H, K]` (K = head_dim · expand_k), v `[B, T, H, V]`, k, v and the
    decay projected for `kv_heads` heads and each shared by H / kv_heads query heads (fla); decay
    log α = logσ(W_α2 W_α1 x + b_α) / τ `[B, T, H, K]` in fp32 (τ = `gate_norm`);
    S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ (K^-½ q_t); then RMSNorm(o) ⊙ SiLU(W_g x) per
    head (eps `norm_eps`, fla's norm_eps) and W_o. No short convs and no feature map (fla's defaults).
    Init: projections normal(0, 0.02), the decay bias b_α = 0 (fla's model init zeroes biases).
    """

    kind = "gla"

    def __init__(self, opts, cfg, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        H, K, V = dims(self.opts)
        D, r, HKV = cfg.dim, self.opts["gate_rank"], self.opts.get("kv_heads", H)
        self.H, self.HKV, self.K, self.V = H, HKV, K, V
        self.q_proj, self.k_proj = linear(D, H * K), linear(D, HKV * K)
        self.v_proj, self.g_proj = linear(D, HKV * V), linear(D, H * V)
        self.gk_proj = nn.Sequential(linear(D, r), linear(r, HKV * K, bias=True))
        self.o_proj = linear(H * V, D)
        self.g_norm = GatedRMSNorm(V, eps=self.opts["norm_eps"], act="silu")
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears(self)

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` holds `state` `[B, H, K, V]`."""
        self.check(x)
        q = self.q_proj(x).unflatten(-1, (self.H, self.K))
        k = self.share(self.k_proj(x).unflatten(-1, (self.HKV, self.K)))
        v = self.share(self.v_proj(x).unflatten(-1, (self.HKV, self.V)))
        gk = self.share(self.gk_proj(x).to(math_dtype(self)).unflatten(-1, (self.HKV, self.K)))
        g = F.logsigmoid(gk) / self.opts["gate_norm"]
        o = gla_core(q, k, v, g, entry, scale=self.K**-0.5, **self.core_kwargs(cu_seqlens))
        gate = self.g_proj(x).unflatten(-1, (self.H, self.V))
        return self.o_proj(self.g_norm(o, gate).flatten(-2))

    def share(self, t: torch.Tensor) -> torch.Tensor:
        """`[B, T, HKV, d]` → `[B, T, H, d]`: kv head j serves query heads j·g … j·g + g − 1 (fla)."""
        return t if self.HKV == self.H else t.repeat_interleave(self.H // self.HKV, dim=2)
