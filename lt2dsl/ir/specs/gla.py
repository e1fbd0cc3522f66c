"""`gla`: gated linear attention with a low-rank per-channel decay (mixers.md §3), as fla's GLA."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import Option, Opts, scaled
from lt2dsl.ir.specs.common import COMMON, NORM_EPS, _heads, cat_width, from_attention, identity_map, lin
from lt2dsl.ir.specs.recurrent import CHUNK, DecaySpec

PROJ = [
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "g_proj.weight",
    "gk_proj.0.weight",
    "gk_proj.1.weight",
    "o_proj.weight",
]
SUB = 16


def dims(o: Opts) -> tuple[int, int, int]:
    """(H, K, V): V = head_dim, K = head_dim · expand_k (fla: key_dim = D·expand_k)."""
    return o["heads"], scaled(o["head_dim"], o["expand_k"]), o["head_dim"]


@dataclass(frozen=True)
class GlaSpec(DecaySpec):
    proj = tuple(PROJ)
    dims = staticmethod(dims)
    sub = SUB

    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """In-projection and gk_proj's second GEMM, the gate's cast, log-sigmoid and scale, the
        recurrent step, gated norm and o_proj."""
        return 8

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """q (H·K, D), g (H·V, D); k (HKV·K, D), v (HKV·V, D) and the decay gate D → rank → HKV·K
        (+ bias), each shared by H / HKV query heads (fla's `num_kv_heads`); o (D, H·V); g_norm (V)
        of the gated RMSNorm."""
        H, K, V = dims(o)
        D, r, HKV = cfg.dim, o["gate_rank"], o.get("kv_heads", H)
        return {
            "q_proj.weight": lin(H * K, D),
            "k_proj.weight": lin(HKV * K, D),
            "v_proj.weight": lin(HKV * V, D),
            "g_proj.weight": lin(H * V, D),
            "gk_proj.0.weight": lin(r, D),
            "gk_proj.1.weight": lin(HKV * K, r),
            "gk_proj.1.bias": (HKV * K,),
            "o_proj.weight": lin(D, H * V),
            "g_norm.weight": (V,),
        }

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """The fused input projection's output (the gated norm's gate and the decay's second
        projection read views of it); the fp32 log-sigmoid's input and output `[T, H, K]` (after sharing); the
        chunk op's q, k `[T, H, K]` and v `[T, H, V]` (k, v shared to every query head), fp32 decay
        `[T, H, K]` and fp32 intra-chunk scores `[T, H, 64]` (`kernels/gla/ops.py`); the output
        norm's input `[T, H, V]`."""
        H, K, V = dims(o)
        proj = cat_width(self.weights(o, cfg), PROJ[:5])
        return proj + 4 * H * K + 2 * H * K + H * V + 2 * H * K + 2 * H * CHUNK + H * V


# fla's layer (`attn.` in its models) names its weights as we do; its output norm is
# `g_norm_swish_gate` when fused with the gate (fla's default), `g_norm` otherwise.
HF_MAP = identity_map(*PROJ, "gk_proj.1.bias", "g_norm.weight") | {
    "g_norm_swish_gate.weight": "g_norm.weight"
}


SPEC = GlaSpec(
    kind="gla",
    summary="gated linear attention: per-channel data-dependent decay, SiLU output gate",
    options=(
        *COMMON,
        Option("expand_k", "number", "key head dim = head_dim · expand_k", default=0.5, min=0, min_open=True),
        Option(
            "kv_heads",
            "int",
            "key/value (and decay) heads, each shared by heads / kv_heads query heads (fla) [heads]",
            default=lambda c, o: o.get("heads", _heads(c, o)),
            min=1,
        ),
        Option("gate_rank", "int", "rank of the low-rank decay gate", default=16, min=1),
        Option(
            "gate_norm",
            "float",
            "gate logit normalizer τ: log α = logσ(·)/τ",
            default=16,
            min=0,
            min_open=True,
        ),
        NORM_EPS,
    ),
    hf_map=HF_MAP,
    from_attention=from_attention(k="kv_heads", v="kv_heads"),
    module="lt2dsl.lowering.layers.gla:GatedLinearAttention",
    source="mixers.md §3 (arXiv 2312.06635); fla `fla/layers/gla.py`",
)
