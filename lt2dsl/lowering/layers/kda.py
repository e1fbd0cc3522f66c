"""`kda`: Kimi delta attention, channel-wise decay (mixers.md §6), as fla's `KimiDeltaAttention`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lt2dsl.ir.specs.recurrent import gva_dims
from lt2dsl.lowering.functional_recurrent import (
    GatedRMSNorm,
    add_qkv_convs,
    conv_qkv,
    init_A_log,
    init_dt_bias,
    init_linears,
    kda_core,
    math_dtype,
)
from lt2dsl.lowering.layers.base import MixerLayer, linear


class KimiDeltaAttention(MixerLayer):
    """Delta rule with a per-channel forget gate and a low-rank sigmoid output gate.

    x `[B, T, D]` → q, k `[B, T, H, K]`, v `[B, T, HV, V]` (V = K · `expand_v`) through projections
    and short convs + SiLU (SiLU alone when `conv=0`), q, k L2-normalised inside the core. Forget
    gate, low rank: f = W_f2 W_f1 x `[B, T, HV, K]`, g = −exp(A_log) · softplus(f + dt_bias), or
    with `safe_gate` g = lower_bound · σ(exp(A_log) · (f + dt_bias)) ∈ (lower_bound, 0);
    β = σ(W_b x); gates in fp32. S_t = (I − β_t k_t k_tᵀ) Diag(e^{g_t}) S_{t−1} + β_t k_t v_tᵀ,
    o_t = S_tᵀ (K^-½ q_t); then RMSNorm(o) ⊙ σ(W_g2 W_g1 x + b_g) per head (eps `norm_eps`, fla's
    norm_eps) and W_o.
    Init: A = U(1, 16) (A_log = 0 with `safe_gate`), dt_bias = softplus⁻¹(dt) with dt
    log-uniform in [1e-3, 0.1]; projections normal(0, 0.02), the output-gate bias 0 (fla).
    """

    kind = "kda"

    def __init__(self, opts, cfg, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        H, HV, K, V = gva_dims(self.opts)
        D = cfg.dim
        self.H, self.HV, self.K, self.V, self.W = H, HV, K, V, self.opts["conv"]
        W = self.W
        self.q_proj, self.k_proj, self.v_proj = linear(D, H * K), linear(D, H * K), linear(D, HV * V)
        self.f_proj = nn.Sequential(linear(D, V), linear(V, HV * K))
        self.b_proj = linear(D, HV)
        self.g_proj = nn.Sequential(linear(D, V), linear(V, HV * V, bias=True))
        self.o_proj = linear(HV * V, D)
        add_qkv_convs(self, H * K, HV * V, W)
        self.A_log = nn.Parameter(torch.empty(HV))
        self.dt_bias = nn.Parameter(torch.empty(HV * K))
        self.o_norm = GatedRMSNorm(V, eps=self.opts["norm_eps"], act="sigmoid")
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears(self)
        if self.opts["safe_gate"]:
            nn.init.zeros_(self.A_log)
        else:
            init_A_log(self.A_log, 1.0, 16.0)
        init_dt_bias(self.dt_bias)

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` holds `state` `[B, HV, K, V]` and the conv buffers."""
        self.check(x)
        q, k, v = conv_qkv(self, x, entry, self.HV, self.V, cu_seqlens)
        gd = math_dtype(self)
        f = (self.f_proj(x).to(gd) + self.dt_bias.to(gd)).unflatten(-1, (self.HV, self.K))
        A = self.A_log.to(gd).exp()[:, None]  # [HV, 1]
        if self.opts["safe_gate"]:
            g = self.opts["lower_bound"] * torch.sigmoid(A * f)
        else:
            g = -A * F.softplus(f)  # [B, T, HV, K]
        beta = torch.sigmoid(self.b_proj(x).to(gd))
        o = kda_core(q, k, v, g, beta, entry, scale=self.K**-0.5, **self.core_kwargs(cu_seqlens))
        gate = self.g_proj(x).unflatten(-1, (self.HV, self.V))
        return self.o_proj(self.o_norm(o, gate).flatten(-2))
