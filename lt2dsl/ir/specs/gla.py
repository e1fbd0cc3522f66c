"""`gla`: gated linear attention with a low-rank per-channel decay (mixers.md §3), as fla's GLA."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import Option, Opts, scaled
from lt2dsl.ir.specs.common import COMMON, NORM_EPS, _heads, from_attention, identity_map, lin
from lt2dsl.ir.specs.recurrent import DecaySpec

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
