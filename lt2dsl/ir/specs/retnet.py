"""`retnet`: multi-scale retention with fixed per-head decays (mixers.md §2)."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import Option, Opts, scaled
from lt2dsl.ir.specs.common import COMMON, from_attention, lin, qkv_weights
from lt2dsl.ir.specs.recurrent import DecaySpec

PROJ = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight", "o_proj.weight"]


def dims(o: Opts) -> tuple[int, int, int]:
    return o["heads"], o["head_dim"], scaled(o["head_dim"], o["expand_v"])


@dataclass(frozen=True)
class RetNetSpec(DecaySpec):
    proj = tuple(PROJ)
    dims = staticmethod(dims)

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """q, k (H·K, D); v, g (H·V, D) with V = K · expand_v; o (D, H·V); g_norm (V)."""
        H, K, V = dims(o)
        D = cfg.dim
        return {
            **qkv_weights(H * K, H * V, D),
            "g_proj.weight": lin(H * V, D),
            "o_proj.weight": lin(D, H * V),
            "g_norm.weight": (V,),
        }


SPEC = RetNetSpec(
    kind="retnet",
    summary="multi-scale retention: fixed per-head decay γ_h = 1 − 2^(−5−h), xPos rotation",
    options=(
        *COMMON,
        Option("expand_v", "number", "value head dim = head_dim · expand_v", default=2, min=0, min_open=True),
    ),
    from_attention=from_attention(),
    module="lt2dsl.lowering.layers.retnet:MultiScaleRetention",
    source="mixers.md §2 (arXiv 2307.08621); torchscale `multiscale_retention.py`",
)
