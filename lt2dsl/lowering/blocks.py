"""The modules around the mixers: norms, MLPs, residual blocks and the per-loop extras.

Parameter names follow `lt2dsl.cost.estimate.block_weights` / `extra_weights` exactly:
`mixers.<j>.*`, `mlp.{gate,up,down}_proj.weight`, `norms.<j>.{weight,bias}` inside a block;
`adapter.weight`, `exit.{weight,bias}` inside a loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lt2dsl.ir import nodes as n
from lt2dsl.ir.specs.channel import block_norm_count
from lt2dsl.lowering import functional as lf
from lt2dsl.lowering.layers import build_mixer
from lt2dsl.lowering.norms import make_norm

__all__ = ["ExitMix", "LoopExtras", "Mlp", "ResidualBlock", "make_norm"]


class Mlp(nn.Module):
    """Channel mixer without biases: SwiGLU `down(silu(gate(x)) * up(x))`, GeGLU
    `down(gelu_tanh(gate(x)) * up(x))` (Gemma) or GELU `down(gelu(up(x)))`.

    x `[B, T, D]` → `[B, T, D]` through a hidden width `spec.hidden`.
    """

    def __init__(self, spec: n.MlpSpec, dim: int):
        super().__init__()
        self.swiglu = spec.type == "swiglu"
        self.geglu = spec.type == "geglu"
        if self.swiglu or self.geglu:
            self.gate_proj = nn.Linear(dim, spec.hidden, bias=False)
        self.up_proj = nn.Linear(dim, spec.hidden, bias=False)
        self.down_proj = nn.Linear(spec.hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        if self.geglu:
            return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x)))


class ResidualBlock(nn.Module):
    """One block (language.md §4): mixer half, then MLP half, each a residual branch.

    Pre-norm:  h = h + mixer(norms0(h));          h = h + mlp(norms1(h))
    Sandwich:  h = h + norms1(mixer(norms0(h)));  h = h + norms3(mlp(norms2(h)))   (Ouro)
    `mlp=none` drops the MLP half and its norms; a `par` block sums its mixers' outputs on the
    same normed input, mixer j reading cache names `"<j>.<name>"` of the block's entry.
    """

    def __init__(self, block: n.Block, cfg: n.ModelConfig, backend: str):
        super().__init__()
        self.block_id = block.id
        self.mixers = nn.ModuleList(build_mixer(m, cfg, backend) for m in block.mixers)
        self.has_mlp = block.mlp.type != "none"
        if self.has_mlp:
            self.mlp = Mlp(block.mlp, cfg.dim)
        self.sandwich = block.norm.sandwich
        count = block_norm_count(block.norm, self.has_mlp)
        self.norms = nn.ModuleList(make_norm(block.norm, cfg.dim) for _ in range(count))

    def forward(self, h: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """h `[B, T, D]` → `[B, T, D]`; `entry` is this application's cache entry (or None);
        `cu_seqlens` the document starts of a packed row (`lt2dsl/lowering/packed.py`) or None."""
        y = self.mix(self.norms[0](h), entry, pos, cu_seqlens)
        if self.sandwich:
            y = self.norms[1](y)
        h = h + y
        if not self.has_mlp:
            return h
        i = 2 if self.sandwich else 1
        y = self.mlp(self.norms[i](h))
        if self.sandwich:
            y = self.norms[i + 1](y)
        return h + y

    def mix(self, x: torch.Tensor, entry, pos, cu_seqlens=None) -> torch.Tensor:
        if len(self.mixers) == 1:
            return self.mixers[0](x, entry, pos, cu_seqlens)
        out = None
        for j, mixer in enumerate(self.mixers):
            y = mixer(x, lf.sub_entry(entry, j), pos, cu_seqlens)
            out = y if out is None else out + y
        return out


class ExitMix(nn.Module):
    """Ouro's exit distribution over a loop's iterations (mixers.md §14.1), without parameters.

    Given the states h^{(τ)} `[B, L, D]` and exit-gate logits `[B, L, 1]` of τ = 1..T, with
    λ_τ = σ(logit_τ) (in fp32, float64 for float64 models):
    p_τ = λ_τ Π_{j<τ}(1 − λ_j) for τ < T and p_T = Π_{j<T}(1 − λ_j) (so Σ p = 1).
    Training: Σ_τ p_τ h^{(τ)} (mixing the logits, the head being linear). Eval: every token takes
    the h^{(τ)} of the first τ whose cumulative p reaches `threshold` (T if none); all iterations
    have run anyway, as Ouro's HF code does. `last_p` keeps p `[B, L, T]` of the last call.

    A leaf of the traced graph, so the train/eval switch is read when it runs, not when traced.
    """

    def __init__(self, threshold: float):
        super().__init__()
        self.threshold = threshold
        self.last_p: torch.Tensor | None = None

    def forward(self, hs: list[torch.Tensor], logits: list[torch.Tensor]) -> torch.Tensor:
        wide = torch.float64 if hs[0].dtype == torch.float64 else torch.float32
        lam = torch.sigmoid(torch.cat(logits, dim=-1).to(wide))  # [B, L, T]
        survive = torch.cumprod(1 - lam, dim=-1)  # Π_{j≤τ}(1 − λ_j)
        before = torch.cat([torch.ones_like(lam[..., :1]), survive[..., :-1]], dim=-1)
        p = torch.cat([(lam * before)[..., :-1], before[..., -1:]], dim=-1)
        self.last_p = p.detach()
        H = torch.stack(hs, dim=-2)  # [B, L, T, D]
        if self.training:
            return (p.to(H.dtype)[..., None] * H).sum(dim=-2)
        reached = torch.cumsum(p, dim=-1) >= self.threshold
        # The first τ reaching the threshold; the last iteration when none does (rounding).
        reached[..., -1] = True
        tau = reached.to(torch.int64).argmax(dim=-1)  # [B, L]
        return H.gather(-2, tau[..., None, None].expand(*tau.shape, 1, H.shape[-1])).squeeze(-2)


class LoopExtras(nn.Module):
    """A loop's own parameters: the `inject=concat` adapter Linear(2D → D, no bias) and the
    `exit=gate` head Linear(D → 1) with its `ExitMix`. Empty for a plain loop."""

    def __init__(self, loop: n.LoopBlock, dim: int):
        super().__init__()
        if loop.inject == "concat":
            self.adapter = nn.Linear(2 * dim, dim, bias=False)
        if loop.exit is not None:
            self.exit = nn.Linear(dim, 1)
            self.mix = ExitMix(loop.exit.threshold)
