"""`dsa`: DeepSeek sparse attention on GQA attention (mixers.md §11; spec `lt2dsl/ir/specs/dsa.py`).

Main attention, as `full` (mixers.md §12): q/k/v/o projections (biases with `bias=true`), per-head
RMSNorm on q and k (`qk_norm`, before RoPE as in Qwen3), half-split RoPE on q and k at absolute
positions, GQA, and the optional σ output gate after attention and before o_proj
(`gate=sdpa|headwise`, computed in fp32).

Lightning indexer (§11(a), read from the normed block input x: lt2dsl's DSA has no MLA query latent):
    q_I = idx_q(x) viewed `[HI, dI]`,  k_I = LayerNorm(idx_k(x)) `[dI]` (one key per token),
    w = idx_w(x) · HI^{-1/2},  I[t, s] = Σ_j w[t, j] · ReLU(dI^{-1/2} · q_I[t, j] · k_I[s]),
which is §11(b)'s score with both positive factors where the sheet puts them. RoPE on the index
vectors: the first half of the channels of q_I and k_I (2·⌊dI/4⌋ of them) is rotated after the
LayerNorm, the rest is not, as §11(a) says. DeepSeek rotates interleaved pairs; lt2dsl uses the same
half-split convention as its main RoPE. The two differ by a fixed permutation of the rotated
channels, which idx_q / idx_k absorb, so the model family is the same. FP8 and the Hadamard rotation
of the index vectors are implementation details (§11(b)) and are left out.

Selection and attention: `lt2dsl.kernels.dsa`. Every query keeps the top-min(topk, t) causal keys by
I (ties to the lower index), and all heads attend over that one set. With topk ≥ t this is dense
causal attention. The selection is discrete, so the indexer gets no gradient from the LM loss; it
learns from `indexer_loss` (the KL alignment of §11(b)).

Cache (per (iteration, block)): `k`, `v` `[B, HKV, L, d]` (keys stored rotated) and `k_idx`
`[B, L, dI]` (normed and rotated), all in the kv (= compute) dtype.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.kernels.dsa import dsa_indexer, dsa_indexer_kl
from lt2dsl.lowering import functional as lf
from lt2dsl.lowering import functional_sparse as fs
from lt2dsl.lowering.layers.attention import add_projections
from lt2dsl.lowering.layers.base import MixerLayer, linear

# DeepSeek-V3.2's indexer LayerNorm and Qwen3's qk-RMSNorm both use 1e-6.
NORM_EPS = 1e-6


class SparseAttention(MixerLayer):
    """DSA mixer: `forward(x [B, T, D], entry, pos) -> [B, T, D]` (module docstring)."""

    kind: ClassVar[str] = "dsa"

    def __init__(self, opts: dict[str, Any], cfg: ModelConfig, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        o, D = self.opts, cfg.dim
        self.H, self.HKV, self.d = o["heads"], o["kv_heads"], o["head_dim"]
        self.HI, self.dI = o["index_heads"], o["index_dim"]
        self.topk, self.theta, self.gate = o["topk"], float(o["rope_theta"]), o["gate"]
        self.idx_scale = self.dI**-0.5
        self.idx_rope_dims = 2 * (self.dI // 4)
        add_projections(self, D, o, NORM_EPS)
        self.idx_q = linear(D, self.HI * self.dI)
        self.idx_k = linear(D, self.dI)
        self.idx_k_norm = nn.LayerNorm(self.dI, eps=NORM_EPS)
        self.idx_w = linear(D, self.HI)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Projections normal(0, 0.02), biases 0, norms 1 (the model rescales o_proj by depth)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.RMSNorm | nn.LayerNorm):
                m.reset_parameters()

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` normed block input, `pos` the position of x[:, 0] -> `[B, T, D]`."""
        fs.check_input(x, self, "dsa")
        q, k, v = self._qkv(x, pos, cu_seqlens)
        q_idx, k_idx, w_idx = self._indexer(x, pos, cu_seqlens)
        # the cache keeps [B, HKV, L, d]; the op wants [B, L, HKV, d]
        k = lf.append_cache(entry, "k", k.transpose(1, 2)).transpose(1, 2)
        v = lf.append_cache(entry, "v", v.transpose(1, 2)).transpose(1, 2)
        k_idx = lf.append_cache(entry, "k_idx", k_idx, dim=1)
        o = fs.dsa_attend(
            q, k, v, q_idx, k_idx, w_idx, self.topk, self.idx_scale, self.backend, pos, cu_seqlens
        )
        if self.gate != "none":
            o = fs.sigmoid_gate(o, self._gate_logits(x))
        return self.o_proj(o.flatten(-2))

    def _qkv(self, x: torch.Tensor, pos, cu_seqlens=None):
        """Rotated q `[B, T, H, d]`, rotated k and v `[B, T, HKV, d]`."""
        q = self.q_proj(x).unflatten(-1, (self.H, self.d))
        k = self.k_proj(x).unflatten(-1, (self.HKV, self.d))
        v = self.v_proj(x).unflatten(-1, (self.HKV, self.d))
        if self.opts["qk_norm"]:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = lf.apply_rope_qk(q, k, pos, self.theta, cu_seqlens=cu_seqlens, backend=self.backend)
        return q, k, v

    def _indexer(self, x: torch.Tensor, pos, cu_seqlens=None):
        """q_I `[B, T, HI, dI]`, k_I `[B, T, dI]` (first half rotated), w `[B, T, HI]` (× HI^{-1/2})."""
        q_idx = self.idx_q(x).unflatten(-1, (self.HI, self.dI))
        k_idx = self.idx_k_norm(self.idx_k(x)).unsqueeze(2)
        q_idx, k_idx = lf.apply_rope_qk(
            q_idx,
            k_idx,
            pos,
            self.theta,
            cu_seqlens=cu_seqlens,
            dims=self.idx_rope_dims,
            backend=self.backend,
        )
        return q_idx, k_idx.squeeze(2), self.idx_w(x) * self.HI**-0.5

    def _gate_logits(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, T, H, d]` (sdpa) or `[B, T, H, 1]` (headwise) pre-sigmoid gate."""
        g = self.g_proj(x)
        return g.unflatten(-1, (self.H, self.d)) if self.gate == "sdpa" else g.unsqueeze(-1)

    def indexer_loss(
        self,
        x: torch.Tensor,
        pos: int = 0,
        *,
        sparse: bool = False,
        reduction: str = "sum",
        cu_seqlens: torch.Tensor | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """The indexer's KL alignment loss Σ_t KL(p_t ‖ softmax(I[t, :])) (mixers.md §11(b)).

        p_t is the main attention's probability over the causal keys, summed over heads and
        L1-normalised; it is a fixed target (no gradient reaches q_proj / k_proj). The indexer reads a
        detached x, so the loss trains only idx_q, idx_k, idx_k_norm and idx_w, and the main model
        learns only from the LM loss (DeepSeek's recipe; in the dense warm-up the main model is
        frozen anyway). Call it on the layer's normed block input, e.g. captured by a forward hook.

        The whole row goes through `dsa_indexer_kl` at once (a packed row too), on the layer's
        backend: the sparse stage reads each query's top-k keys, O(T·topk) (on Triton, one fused
        kernel each way); the dense warm-up scores query chunks against their documents' keys.
        Backward keeps the projections `[B, T, ·]` and the sparse stage's targets `[B, T, topk]`.

        Args:
            x (torch.Tensor): `[B, T, D]` normed block input of a whole sequence (no cache).
            pos (int, Optional): position of x[:, 0]. Default: `0`.
            sparse (bool, Optional): restrict both distributions to the indexer's top-k selection
                (the sparse stage); False compares over all causal keys (dense warm-up). Default: `False`.
            reduction (str, Optional): "sum", "mean" or "none" (`[B, T]`). Default: `"sum"`.
            cu_seqlens (torch.Tensor, Optional): `[N + 1]` document starts of a packed row (B = 1):
                each document is its own sequence, at positions from 0. Default: `None`.
            chunk (int, Optional): queries per chunk; default: `dsa_indexer_kl`'s memory budget.

        Returns:
            torch.Tensor: scalar (or `[B, T]`), fp32 (float64 for a float64 layer).
        """
        fs.check_input(x, self, "dsa")
        if reduction not in ("sum", "mean", "none"):
            raise ValueError(f"reduction must be 'sum', 'mean' or 'none', got {reduction!r}")
        x = x.detach()
        with torch.no_grad():
            q, k, _ = self._qkv(x, pos, cu_seqlens)
        q_idx, k_idx, w_idx = self._indexer(x, pos, cu_seqlens)
        indices = None
        if sparse:
            indices = dsa_indexer(
                q_idx.detach(),
                k_idx.detach(),
                w_idx.detach(),
                topk=self.topk,
                idx_scale=self.idx_scale,
                cu_seqlens=cu_seqlens,
                backend=self.backend,
                ordered=False,
            )
        return dsa_indexer_kl(
            q,
            k,
            q_idx,
            k_idx,
            w_idx,
            idx_scale=self.idx_scale,
            indices=indices,
            cu_seqlens=cu_seqlens,
            reduction=reduction,
            chunk=chunk,
            backend=self.backend,
        )
