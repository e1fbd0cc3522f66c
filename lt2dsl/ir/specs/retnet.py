"""`retnet`: multi-scale retention with fixed per-head decays (mixers.md §2)."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import Option, Opts, scaled
from lt2dsl.ir.specs.common import COMMON, cat_width, from_attention, lin, qkv_weights
from lt2dsl.ir.specs.recurrent import DecaySpec

PROJ = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight", "o_proj.weight"]


def dims(o: Opts) -> tuple[int, int, int]:
    return o["heads"], o["head_dim"], scaled(o["head_dim"], o["expand_v"])


@dataclass(frozen=True)
class RetNetSpec(DecaySpec):
    proj = tuple(PROJ)
    dims = staticmethod(dims)

    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """In-projection GEMM, xPos of q and k, the retention step, gated norm and o_proj."""
        return 5

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

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """The fused q, k, v, g projection's output (the gated norm's gate is a view of it); the
        xPos-rotated q, k `[T, H, K]`, v `[T, H, V]` and the fp32 decay `[T, H]` the chunk op saves
        (`kernels/simple_gla/ops.py`); the output norm's input `[T, H, V]`; the rotation's four
        fp32 cos/sin tables `[T, K/2]`, per position and so counted once per token of a batch row
        (exact at batch 1; at batch B they weigh 1/B of that)."""
        H, K, V = dims(o)
        proj = cat_width(self.weights(o, cfg), PROJ[:4])
        return proj + 2 * H * K + 2 * H * V + 2 * H + 4 * K


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
