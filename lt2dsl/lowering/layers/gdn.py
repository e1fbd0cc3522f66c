"""`gdn`: gated DeltaNet (mixers.md §5), parameterized as fla's `GatedDeltaNet` layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lt2dsl.ir.specs.recurrent import gva_dims
from lt2dsl.lowering.functional_recurrent import (
    GatedRMSNorm,
    add_qkv_convs,
    conv_qkv,
    gated_delta_rule_core,
    init_A_log,
    init_dt_bias,
    init_linears,
    math_dtype,
)
from lt2dsl.lowering.layers.base import MixerLayer, linear


class GatedDeltaNet(MixerLayer):
    """Gated delta rule with a scalar per-value-head decay and a SiLU-gated output norm.

    x `[B, T, D]` → q, k `[B, T, H, K]` and v `[B, T, HV, V]` through projections and short convs
    (+ SiLU; SiLU alone when `conv=0`, as fla does), q, k L2-normalised inside the core;
    g = −exp(A_log) · softplus(W_a x + dt_bias), β = σ(W_b x) (×2 with `neg_eigval`), both
    `[B, T, HV]` in fp32; S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ (K^-½ q_t);
    then RMSNorm(o) ⊙ SiLU(W_g x) per head (plain RMSNorm without `gate`; eps `norm_eps`, fla's
    norm_eps) and W_o. Init: A = U(0, 16) (fla), dt_bias = softplus⁻¹(dt), dt log-uniform in
    [dt_max/100, dt_max] (fla: dt_max = 0.1); projections normal(0, 0.02); conv taps PyTorch's
    Conv1d default (fla's layer). At a = 0 a head keeps its state for about 1/(A·dt) tokens: fla's
    range gives a median of ~16 tokens and ~5% of heads over 256, which a small model must learn
    past before it can recall over longer gaps; a smaller `dt_max` starts with long memories.
    """

    kind = "gdn"

    def __init__(self, opts, cfg, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        H, HV, K, V = gva_dims(self.opts)
        D, W = cfg.dim, self.opts["conv"]
        self.H, self.HV, self.K, self.V, self.W = H, HV, K, V, W
        self.q_proj, self.k_proj = linear(D, H * K), linear(D, H * K)
        self.v_proj = linear(D, HV * V)
        self.a_proj, self.b_proj = linear(D, HV), linear(D, HV)
        if self.opts["gate"]:
            self.g_proj = linear(D, HV * V)
        self.o_proj = linear(HV * V, D)
        add_qkv_convs(self, H * K, HV * V, W)
        self.A_log = nn.Parameter(torch.empty(HV))
        self.dt_bias = nn.Parameter(torch.empty(HV))
        self.o_norm = GatedRMSNorm(V, eps=self.opts["norm_eps"], act="silu" if self.opts["gate"] else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears(self)
        init_A_log(self.A_log, 0.0, 16.0)
        dt_max = float(self.opts["dt_max"])
        # fla's range spans two decades; its 1e-4 floor only ever binds for a smaller dt_max
        init_dt_bias(self.dt_bias, dt_max / 100, dt_max, floor=min(1e-4, dt_max / 100))

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` holds `state` `[B, HV, K, V]` and the conv buffers."""
        self.check(x)
        q, k, v = conv_qkv(self, x, entry, self.HV, self.V, cu_seqlens)
        gd = math_dtype(self)
        A = self.A_log.to(gd).exp()
        g = -A * F.softplus(self.a_proj(x).to(gd) + self.dt_bias.to(gd))  # [B, T, HV]
        beta = torch.sigmoid(self.b_proj(x).to(gd))
        if self.opts["neg_eigval"]:
            beta = beta * 2.0
        o = gated_delta_rule_core(q, k, v, g, beta, entry, scale=self.K**-0.5, **self.core_kwargs(cu_seqlens))
        gate = self.g_proj(x).unflatten(-1, (self.HV, self.V)) if self.opts["gate"] else None
        o = self.o_norm(o, gate)
        return self.o_proj(o.flatten(-2))
