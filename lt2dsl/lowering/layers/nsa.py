"""`nsa`: native sparse attention (mixers.md §10; spec `lt2dsl/ir/specs/nsa.py`).

q `[H, d]`, k and v `[HKV, d]` projections (no biases), half-split RoPE on q and k at absolute
positions, and the branch gates g = σ(g_proj(x)) `[H, 3]`. As in fla's `NativeSparseAttention`
layer, the 3H outputs of g_proj are read per head as (cmp, slc, swa) triples. The three branches,
one set of keys and values shared by all of them (as fla does; §10(a)):

* compressed: φ over blocks of `cmp_block` l tokens with stride d of the rotated keys (and of the
  values), attention over the blocks entirely in the past;
* selected: the top-`select` blocks of `block` l' tokens, scored by the compressed probabilities
  (group-averaged over a kv head's query heads), block 0 and the current and previous blocks forced;
* sliding window of `window` keys, the query's own included.

Then o = g_cmp·o_cmp + g_slc·o_slc + g_swa·o_swa per head, and o_proj. The branches and the block
choice are `lt2dsl.kernels.nsa`. φ is `compress=mean` (fla's mean pooling) or `compress=mlp`, the
paper's learned map sized by the spec: per k and v an intra-block position embedding `pos [l, d]`
and a linear map `proj: l·d -> d` with bias, φ(X) = proj(flatten(X + pos)), shared by the kv heads.
It is initialised to mean pooling (pos 0, proj = [I/l … I/l], bias 0). mixers.md gives no init for
φ, and this one starts the learned model at fla's choice.

Cache (per (iteration, block)): `k`, `v` `[B, HKV, L, d]` (all keys, rotated: selection can reach
any past block) and `k_cmp`, `v_cmp` `[B, HKV, n_cmp(L), d]`. A compressed entry is appended as
soon as its block of l tokens is complete, so a decode step runs φ at most once per stride tokens.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.lowering import functional as lf
from lt2dsl.lowering import functional_sparse as fs
from lt2dsl.lowering.layers.base import MixerLayer, linear


class BlockCompressor(nn.Module):
    """Learned φ of `compress=mlp`: `pos [l, d]` and `proj` (l·d -> d, bias); used through `nsa_compress`."""

    def __init__(self, block: int, d: int):
        super().__init__()
        self.block, self.d = block, d
        self.pos = nn.Parameter(torch.zeros(block, d))
        self.proj = nn.Linear(block * d, d)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Start as mean pooling: φ(X) = mean over the block's l rows."""
        nn.init.zeros_(self.pos)
        with torch.no_grad():
            eye = torch.eye(self.d, dtype=self.proj.weight.dtype) / self.block
            self.proj.weight.copy_(eye.repeat(1, self.block))
        nn.init.zeros_(self.proj.bias)


class NativeSparseAttention(MixerLayer):
    """NSA mixer: `forward(x [B, T, D], entry, pos) -> [B, T, D]` (module docstring)."""

    kind: ClassVar[str] = "nsa"

    def __init__(self, opts: dict[str, Any], cfg: ModelConfig, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        o, D = self.opts, cfg.dim
        self.H, self.HKV, self.d = o["heads"], o["kv_heads"], o["head_dim"]
        self.theta = float(o["rope_theta"])
        self.geometry = dict(
            select=o["select"],
            block=o["block"],
            window=o["window"],
            cmp_block=o["cmp_block"],
            stride=o["stride"],
        )
        self.q_proj = linear(D, self.H * self.d)
        self.k_proj = linear(D, self.HKV * self.d)
        self.v_proj = linear(D, self.HKV * self.d)
        self.g_proj = linear(D, 3 * self.H)
        self.o_proj = linear(self.H * self.d, D)
        if o["compress"] == "mlp":
            self.cmp_k = BlockCompressor(o["cmp_block"], self.d)
            self.cmp_v = BlockCompressor(o["cmp_block"], self.d)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Projections normal(0, 0.02) (the model rescales o_proj by depth); φ as mean pooling."""
        for name in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj"):
            nn.init.normal_(getattr(self, name).weight, std=0.02)
        for m in self.modules():
            if isinstance(m, BlockCompressor):
                m.reset_parameters()

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` normed block input, `pos` the position of x[:, 0] -> `[B, T, D]`."""
        fs.check_input(x, self, "nsa")
        # v before the RoPE: the decode step's RoPE kernel then writes k and v into the cache in
        # one launch (fusion rule `rope_cache` joins a v append computed before the rope_pair)
        v = self.v_proj(x).unflatten(-1, (self.HKV, self.d))
        q, k = lf.apply_rope_qk(
            self.q_proj(x).unflatten(-1, (self.H, self.d)),
            self.k_proj(x).unflatten(-1, (self.HKV, self.d)),
            pos,
            self.theta,
            cu_seqlens=cu_seqlens,
            backend=self.backend,
        )
        g = self.g_proj(x).unflatten(-1, (self.H, 3))  # logits: `nsa_attend` takes their sigmoid
        # the cache keeps [B, HKV, L, d]; the op wants [B, L, HKV, d]
        k = lf.append_cache(entry, "k", k.transpose(1, 2)).transpose(1, 2)
        v = lf.append_cache(entry, "v", v.transpose(1, 2)).transpose(1, 2)
        (l, s, *phi_k), (_, _, *phi_v) = self._phi("k"), self._phi("v")
        k_cmp, v_cmp = fs.nsa_compress_kv(
            k, v, entry, l, s, tuple(phi_k), tuple(phi_v), cu_seqlens=cu_seqlens, backend=self.backend
        )
        o = fs.nsa_attend(
            q, k, v, g, k_cmp, v_cmp, backend=self.backend, pos=pos, cu_seqlens=cu_seqlens, **self.geometry
        )
        return self.o_proj(o.flatten(-2))

    def _phi(self, which: str) -> tuple:
        """Arguments of `nsa_compress` after the key: block geometry and the learned φ (or none)."""
        l, s = self.opts["cmp_block"], self.opts["stride"]
        if self.opts["compress"] != "mlp":
            return l, s
        m = getattr(self, f"cmp_{which}")
        return l, s, m.pos, m.proj.weight, m.proj.bias
