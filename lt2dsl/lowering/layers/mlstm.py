"""`mlstm`: xLSTM matrix memory (mixers.md §8), parameterized as the xLSTM-7B layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lt2dsl.ir.specs.mlstm import dims
from lt2dsl.lowering.functional_recurrent import (
    init_linears,
    math_dtype,
    mlstm_core,
    param_dtype,
)
from lt2dsl.lowering.layers.base import MixerLayer, linear


class MultiHeadLayerNorm(nn.Module):
    """LayerNorm over each head's V channels with a per-channel weight `[H·V]`, no bias (xLSTM-7B)."""

    def __init__(self, heads: int, dim: int, eps: float = 1e-6):
        super().__init__()
        self.heads, self.dim, self.eps = heads, dim, eps
        self.weight = nn.Parameter(torch.ones(heads * dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h `[B, T, H, V]` → `[B, T, H·V]`, normalised in fp32 (float64 for a float64 module)."""
        dt = math_dtype(self)
        y = F.layer_norm(h.to(dt), (self.dim,), eps=self.eps).flatten(-2)
        return (y * self.weight.to(dt)).to(param_dtype(self))


class MLSTM(MixerLayer):
    """Matrix-memory LSTM with exponential input gate, max stabiliser and normaliser.

    x `[B, T, D]` → q, k `[B, T, H, K]` (K = head_dim · qk_dim_factor), v `[B, T, H, V]`;
    gate pre-activations ĩ, f̃ = cap · tanh(W x + b / cap) soft-capped (`gate_cap`, 15) `[B, T, H]`
    in fp32; the stabilised cell (mixers.md §8(b), k scaled by K^-½, ε = 1e-6) gives h̃
    `[B, T, H, V]`; out = W_out(σ(W_o x) ⊙ LayerNorm_head(h̃)) (eps 1e-6, weight only).
    Init (mixers.md §8(a), the original mLSTM block): gate weights 0, f̃ bias linspace(3, 6) over
    heads, ĩ bias N(0, 0.1²); other projections normal(0, 0.02).
    """

    kind = "mlstm"

    def __init__(self, opts, cfg, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        H, K, V = dims(self.opts)
        D = cfg.dim
        self.head_projections(H, K, V)
        self.ogate = linear(D, H * V)
        self.igate, self.fgate = linear(D, H, bias=True), linear(D, H, bias=True)
        self.norm = MultiHeadLayerNorm(H, V, eps=1e-6)
        self.out_proj = linear(H * V, D)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears(self)
        with torch.no_grad():
            nn.init.zeros_(self.igate.weight)
            nn.init.zeros_(self.fgate.weight)
            nn.init.normal_(self.igate.bias, 0.0, 0.1)
            self.fgate.bias.copy_(torch.linspace(3.0, 6.0, self.H))

    def _cap(self, a: torch.Tensor) -> torch.Tensor:
        cap = float(self.opts["gate_cap"])
        return cap * torch.tanh(a.to(math_dtype(self)) / cap)

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` holds `C` `[B, H, K, V]`, `n` `[B, H, K]`, `m` `[B, H]`."""
        self.check(x)
        q = self.q_proj(x).unflatten(-1, (self.H, self.K))
        k = self.k_proj(x).unflatten(-1, (self.H, self.K))
        v = self.v_proj(x).unflatten(-1, (self.H, self.V))
        i, f = self._cap(self.igate(x)), self._cap(self.fgate(x))
        h = mlstm_core(q, k, v, i, f, entry, scale=self.K**-0.5, eps=1e-6, **self.core_kwargs(cu_seqlens))
        return self.out_proj(torch.sigmoid(self.ogate(x)) * self.norm(h))
