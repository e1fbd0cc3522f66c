"""`tmm`: Toeplitz MLP mixer token mixing (mixers.md §13; spec `lt2dsl/ir/specs/tmm.py`).

Per channel c (of head η = c // (D/heads)), with the kernel variant's k taps,
    y[c, t] = Σ_{j<k} Σ_{s≤t} w[j, η, t − s] · u[c − k + 1 + j, s] + b[η, t]   (channels < 0 are 0),
a causal, input-independent lower-triangular Toeplitz product over time with a position bias.
With `heads` = 1, u = x and the output is y: the prototype's single Toeplitz layer. With `heads` > 1,
u = in_proj(x) and the output is out_proj(y), both D -> D with biases: the multi-head TMM. The
product is `lt2dsl.kernels.toeplitz_mix` over a whole sequence (on CUDA: blocked DFTs on tensor
cores for a bf16/fp16 layer with kernel size 1 and heads of a multiple of 32 channels, else FFT in
fp32; float64 for a float64 layer), and `toeplitz_mix_step` over the cached inputs for one decode
token.

Init (§13(a)): Kaiming-normal on w with fan-in n = max_len (std √(2/n)), zero position bias;
in_proj / out_proj weights normal(0, 0.02) with zero biases. The model rescales out_proj by depth.

Cache (per (iteration, block)): `x` `[B, L, D]`, the mixer inputs u_1..u_L (after in_proj when
heads > 1) in the activation dtype. There is no finite state, so decode is O(L) per token. A
sequence longer than max_len has no kernel weights and raises ValueError naming max_len.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.lowering import functional_sparse as fs
from lt2dsl.lowering.layers.base import MixerLayer, linear


class ToeplitzMixer(MixerLayer):
    """TMM mixer: `forward(x [B, T, D], entry, pos) -> [B, T, D]` (module docstring)."""

    kind: ClassVar[str] = "tmm"

    def __init__(self, opts: dict[str, Any], cfg: ModelConfig, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        o, D = self.opts, cfg.dim
        self.heads, self.kernel, self.max_len = o["heads"], o["kernel"], o["max_len"]
        self.w = nn.Parameter(torch.empty(self.kernel, self.heads, self.max_len))
        self.bias = nn.Parameter(torch.empty(self.heads, self.max_len))
        if self.heads > 1:
            self.in_proj = linear(D, D, bias=True)
            self.out_proj = linear(D, D, bias=True)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming-normal w (fan-in max_len), zero bias; projections normal(0, 0.02), zero biases."""
        nn.init.normal_(self.w, std=math.sqrt(2.0 / self.max_len))
        nn.init.zeros_(self.bias)
        if self.heads > 1:
            for m in (self.in_proj, self.out_proj):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` normed block input -> `[B, T, D]`.

        `pos` is not read: the cache's length gives the positions of the position bias.
        """
        fs.check_input(x, self, "tmm")
        u = self.in_proj(x) if self.heads > 1 else x
        y = fs.toeplitz_cached(u, self.w, self.bias, entry, self.max_len, self.backend, cu_seqlens)
        return self.out_proj(y) if self.heads > 1 else y
