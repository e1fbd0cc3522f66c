"""`linear`: vanilla linear attention with a feature map (mixers.md §1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lt2dsl.ir.specs.linear import feature_dim
from lt2dsl.lowering.functional_recurrent import (
    GatedRMSNorm,
    init_linears,
    math_dtype,
    simple_gla_core,
)
from lt2dsl.lowering.layers.base import MixerLayer, linear

EPS = 1e-6  # normaliser ε of fast-transformers (mixers.md §1(b))


class HedgehogMap(nn.Module):
    """φ(x) = softmax([2(A x + a), −2(A x + a)]) per head: `[B, T, H, K]` → `[B, T, H, 2K]`.

    A `[H, K, K]` (nn.Linear's (out, in) layout per head) starts at the identity, a `[H, K]` at 0.
    """

    def __init__(self, heads: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(dim).repeat(heads, 1, 1))
        self.bias = nn.Parameter(torch.zeros(heads, dim))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.copy_(torch.eye(self.weight.shape[-1]).expand_as(self.weight))
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.einsum("bthk,hjk->bthj", x, self.weight) + self.bias
        return torch.cat([2 * z, -2 * z], dim=-1).softmax(dim=-1)


class LinearAttention(MixerLayer):
    """Linear attention without decay: φ(q), φ(k), and a normaliser or an output RMSNorm.

    x `[B, T, D]` → q, k, v `[B, T, H, K]`; q̂ = φ(q), k̂ = φ(k) `[B, T, H, K']` with φ = elu+1,
    relu, identity or hedgehog (K' = 2K). S_t = S_{t−1} + k̂_t v_tᵀ.
    `normalize=true`: v gets a ones column so the state `[K', V+1]` carries z_t = Σ k̂ too, and
    o_t = S_tᵀ q̂_t / (q̂_tᵀ z_t + 1e-6) (fast-transformers; only safe for positive φ).
    `normalize=false`: o_t = RMSNorm_head(K'^-½ S_tᵀ q̂_t) (fla's default; weight `o_norm`, eps 1e-5).
    Then W_o. Init: projections normal(0, 0.02), hedgehog maps A = I, a = 0.
    """

    kind = "linear"

    def __init__(self, opts, cfg, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        H, K, D = self.opts["heads"], self.opts["head_dim"], cfg.dim
        self.H, self.K, self.Kf = H, K, feature_dim(self.opts)
        self.q_proj, self.k_proj, self.v_proj = linear(D, H * K), linear(D, H * K), linear(D, H * K)
        self.o_proj = linear(H * K, D)
        if self.opts["feature_map"] == "hedgehog":
            self.q_fm, self.k_fm = HedgehogMap(H, K), HedgehogMap(H, K)
        if not self.opts["normalize"]:
            self.o_norm = GatedRMSNorm(K, eps=1e-5, act=None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears(self)
        if self.opts["feature_map"] == "hedgehog":
            self.q_fm.reset_parameters()
            self.k_fm.reset_parameters()

    def _phi(self, x: torch.Tensor, which: str) -> torch.Tensor:
        fm = self.opts["feature_map"]
        if fm == "elu1":
            return F.elu(x) + 1.0
        if fm == "relu":
            return F.relu(x)
        if fm == "hedgehog":
            return getattr(self, f"{which}_fm")(x)
        return x

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` holds `state` `[B, H, K', V (+1)]`."""
        self.check(x)
        q = self._phi(self.q_proj(x).unflatten(-1, (self.H, self.K)), "q")
        k = self._phi(self.k_proj(x).unflatten(-1, (self.H, self.K)), "k")
        v = self.v_proj(x).unflatten(-1, (self.H, self.K))
        # autocast runs softmax (hedgehog) in fp32; the core wants one dtype for q, k, v
        q, k = q.to(v.dtype), k.to(v.dtype)
        if not self.opts["normalize"]:
            o = simple_gla_core(q, k, v, None, entry, scale=self.Kf**-0.5, **self.core_kwargs(cu_seqlens))
            return self.o_proj(self.o_norm(o).flatten(-2))
        v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # [B, T, H, V+1]
        o = simple_gla_core(q, k, v1, None, entry, scale=1.0, **self.core_kwargs(cu_seqlens))
        gd = math_dtype(self)
        num, den = o[..., :-1].to(gd), o[..., -1:].to(gd)
        # `v.dtype`, not the parameters': a traced block (the trainer's fused code) would keep the
        # dtype its trace saw, and the trainer swaps bf16 weight copies in for the fp32 masters
        return self.o_proj((num / (den + EPS)).to(v.dtype).flatten(-2))
