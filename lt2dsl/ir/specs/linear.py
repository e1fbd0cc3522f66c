"""`linear`: vanilla linear attention with a feature map (mixers.md §1)."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import CacheTensor, Flops, LayerSpec, Mode, Option, Opts
from lt2dsl.ir.specs.common import COMMON, cat_width, from_attention, lin, proj_flops, qkv_weights
from lt2dsl.ir.specs.recurrent import chunk_of, decay_core, state

PROJ = ("q_proj.weight", "k_proj.weight", "v_proj.weight")


def feature_dim(o: Opts) -> int:
    """K' = 2K for hedgehog (softmax over [z, −z]), K otherwise."""
    return 2 * o["head_dim"] if o["feature_map"] == "hedgehog" else o["head_dim"]


def value_dim(o: Opts) -> int:
    """The normalizer rides along as an extra ones column of v, so the state is K'×(V+1)."""
    return o["head_dim"] + (1 if o["normalize"] else 0)


def _normalize(cfg: ModelConfig | None, o: Opts) -> bool:
    """The normaliser q̂ᵀz is a sum of feature products: positive for elu1 and hedgehog, never
    negative for relu, of either sign for identity (mixers.md §1(e)); identity gets the RMSNorm."""
    return o.get("feature_map", "elu1") != "identity"


@dataclass(frozen=True)
class LinearSpec(LayerSpec):
    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """In-projection GEMM, the feature maps and normalizer (torch ops), the recurrent step,
        o_proj."""
        return 14

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """q, k, v (H·K, D); o (D, H·V); hedgehog: per head K×K maps with bias for q and k;
        without the normalizer a per-head RMSNorm (V) on the output (fla's default)."""
        H, K, D = o["heads"], o["head_dim"], cfg.dim
        w = {
            **qkv_weights(H * K, H * K, D),
            "o_proj.weight": lin(D, H * K),
        }
        if o["feature_map"] == "hedgehog":
            w |= {
                "q_fm.weight": (H, K, K),
                "q_fm.bias": (H, K),
                "k_fm.weight": (H, K, K),
                "k_fm.bias": (H, K),
            }
        if not o["normalize"]:
            w["o_norm.weight"] = (K,)
        return w

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        return state(batch, o["heads"], feature_dim(o), value_dim(o))

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        """Core per head: 2C(K'+V') + 4K'V' chunked, 4K'V' decode, V' = V (+1 normalizer)."""
        H, K = o["heads"], o["head_dim"]
        Kf, Vf = feature_dim(o), value_dim(o)
        proj = proj_flops(
            self.weights(o, cfg), ["q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"]
        )
        if o["feature_map"] == "hedgehog":
            proj += 2 * (2 * H * K * K)
        core = 4 * Kf * Vf if mode == "decode" else decay_core(Kf, Vf, chunk_of(L))
        return Flops(proj=proj, core=float(H * core))

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """The fused q, k, v projection's output when φ keeps its input (elu1's ELU, hedgehog's
        map read views of it; relu keeps its output, identity nothing); the chunk op's φ(q), φ(k)
        `[T, H, K']` and v `[T, H, V']` (`kernels/simple_gla/ops.py`); with the normaliser the
        fp32 numerator `[T, H, K]` and denominator `[T, H]` of the division and o_proj's input
        `[T, H, K]`, without it the output norm's input `[T, H, K]`."""
        H, K = o["heads"], o["head_dim"]
        proj = cat_width(self.weights(o, cfg), PROJ) if o["feature_map"] in ("elu1", "hedgehog") else 0
        out = 3 * H * K + 2 * H if o["normalize"] else H * K
        return proj + 2 * H * feature_dim(o) + H * value_dim(o) + out


SPEC = LinearSpec(
    kind="linear",
    summary="vanilla linear attention: feature map φ, no decay, optional normalizer",
    options=(
        *COMMON,
        Option(
            "feature_map",
            "enum",
            "φ applied to q and k",
            default="elu1",
            choices=("elu1", "relu", "identity", "hedgehog"),
            positional=True,
        ),
        Option(
            "normalize",
            "bool",
            "divide by q̂ᵀz (else a per-head RMSNorm on the output); needs positive features",
            default=_normalize,
        ),
    ),
    from_attention=from_attention(),
    module="lt2dsl.lowering.layers.linear:LinearAttention",
    source="mixers.md §1 (arXiv 2006.16236); fast-transformers causal_linear_attention",
)
