"""`dsa`: DeepSeek sparse attention, a lightning indexer choosing top-k keys (mixers.md §11).

lt2dsl's DSA sits on GQA attention (not MLA): the indexer projects the block input x to H_I
index queries of d_I dims and one shared index key (LayerNorm'd) per token, with per-head weights
w = x W_w; scores I[t,s] = Σ_j w[t,j] · ReLU(q_I[t,j] · k_I[s]) (scaled), causal top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import CacheTensor, Flops, Mode, Option, Opts
from lt2dsl.ir.specs.common import ATTENTION, COMMON, DECODE_SMS, cat_width, causal_mean, lin, proj_flops
from lt2dsl.ir.specs.full import (
    FROM_ATTENTION,
    PROJ,
    FullSpec,
    attention_core,
    attention_extra_kernels,
    attention_saved,
    attention_weights,
    rope_key,
)

IDX = ["idx_q.weight", "idx_k.weight", "idx_w.weight"]
# The decode select splits each row's keys over programs (5 launches instead of 1) for at most
# this many rows of at least this many keys (`kernels.dsa.triton_topk.use_split`; a test holds
# the two equal).
SPLIT_MAX_ROWS = 128
SPLIT_MIN_KW = 4096
# The decode step's sparse attention splits each selection over programs, merged by a combine
# kernel, while its batch × kv-head programs leave SMs idle (`DECODE_SMS`) and the top-k spans
# more than two 64-slot chunks (`kernels.dsa.triton_attn.split_count`).
SPARSE_SPLIT_MIN_TOPK = 2 * 64


@dataclass(frozen=True)
class DsaSpec(FullSpec):
    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Attention weights plus the indexer: idx_q (H_I·d_I, D), idx_k (d_I, D),
        idx_k_norm (LayerNorm, weight and bias d_I), idx_w (H_I, D)."""
        HI, dI, D = o["index_heads"], o["index_dim"], cfg.dim
        return attention_weights(o, D) | {
            "idx_q.weight": lin(HI * dI, D),
            "idx_k.weight": lin(dI, D),
            "idx_k_norm.weight": (dI,),
            "idx_k_norm.bias": (dI,),
            "idx_w.weight": lin(HI, D),
        }

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """KV cache plus one index key per token, (B, L, d_I), kept in the kv dtype."""
        return super().cache(o, cfg, batch, L) | {
            "k_idx": CacheTensor((batch, L, o["index_dim"]), "kv", "kv")
        }

    def decode_read(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """The indexer scores every cached index key; the main attention gathers the top-k keys'
        k and v only."""
        main = super().cache(o, cfg, batch, min(L, o["topk"]))
        return main | {"k_idx": self.cache(o, cfg, batch, L)["k_idx"]}

    def prefill_gather(self, o: Opts, cfg: ModelConfig, L: int) -> float:
        """Each query gathers its own top-k keys' k and v for every kv head: min(t, topk) · HKV · 2d
        (no query shares the set it selected, so no tile is reused)."""
        return causal_mean(L, o["topk"]) * o["kv_heads"] * 2 * o["head_dim"]

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        """Indexer 2·H_I·d_I per visible key; main attention over min(t, topk) keys per head."""
        proj = proj_flops(self.weights(o, cfg), PROJ + IDX)
        k = o["topk"]
        if mode == "decode":
            index_keys, main_keys = float(L), float(min(L, k))
        elif causal == "full":
            index_keys = main_keys = float(L)
        else:
            index_keys, main_keys = causal_mean(L), causal_mean(L, k)
        index = 2.0 * o["index_heads"] * o["index_dim"] * index_keys
        return Flops(proj=proj, core=index + attention_core(o["heads"], o["head_dim"], main_keys))

    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """The fused attention and indexer GEMM, RoPE of q/k and of the indexer's q/k (each written
        into its cache), index scores, top-k select (5 launches when sliced), sparse attention
        (and its combine when split), o_proj; `full`'s q/k-norm launches."""
        select = 5 if batch <= SPLIT_MAX_ROWS and L >= SPLIT_MIN_KW else 1
        attend = 2 if batch * o["kv_heads"] < DECODE_SMS and o["topk"] > SPARSE_SPLIT_MIN_TOPK else 1
        return 5 + select + attend + attention_extra_kernels(o)

    def decode_once(self, o: Opts, cfg: ModelConfig) -> dict[tuple, int]:
        """Both RoPE tables' rows (the main heads' and the indexer's, `2·(d_I // 4)` dims)."""
        return {rope_key(o): 2, rope_key(o, 2 * (o["index_dim"] // 4)): 2}

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """The sparse attention op's tensors (`kernels/dsa/ops.py`): rotated q `[T, H, d]` and k
        `[T, HKV, d]`, v (a view of the fused q, k, v and indexer projection, so all of that),
        the output `[T, H, d]`, fp32 log-sum-exp `[T, H]` and the int64 top-k key indices
        `[T, topk]`; the q/k norms as `full`'s. The indexer runs without gradient: nothing of it
        is kept. `gate` (a separate σ-gate op here) is not counted."""
        H, HKV, d = o["heads"], o["kv_heads"], o["head_dim"]
        proj = cat_width(self.weights(o, cfg), ["q_proj.weight", "k_proj.weight", "v_proj.weight", *IDX])
        qk = attention_saved(o | {"gate": "none"}, cfg) - (2 * H * d + 2 * HKV * d + 2 * H)
        return 2 * H * d + HKV * d + 2 * H + proj + 4 * o["topk"] + qk


SPEC = DsaSpec(
    kind="dsa",
    summary="DeepSeek sparse attention: lightning indexer + causal top-k over GQA attention",
    options=(
        *COMMON,
        Option(
            "topk",
            "size",
            "keys each query attends to (all heads share the choice)",
            default=2048,
            min=1,
            positional=True,
        ),
        Option("index_heads", "int", "lightning-indexer heads H_I", default=4, min=1),
        Option("index_dim", "int", "lightning-indexer head dim d_I", default=64, min=1),
        *ATTENTION,
    ),
    from_attention=FROM_ATTENTION,
    module="lt2dsl.lowering.layers.dsa:SparseAttention",
    source="mixers.md §11 (DeepSeek-V3.2-Exp report, Eqs. 1-4); GQA main attention per §11(c)",
)
