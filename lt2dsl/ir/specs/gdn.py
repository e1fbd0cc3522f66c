"""`gdn`: gated DeltaNet (mixers.md §5), parameterized as fla's `GatedDeltaNet` layer."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import CacheTensor, Flops, LayerSpec, Mode, Option, Opts, scaled
from lt2dsl.ir.specs.common import (
    COMMON,
    CONV,
    NORM_EPS,
    V_HEADS,
    conv_flops,
    from_attention,
    identity_map,
    lin,
    proj_flops,
    qkv_weights,
)
from lt2dsl.ir.specs.recurrent import chunk_of, conv_cache, conv_weights, delta_core, state

PROJ = [
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "a_proj.weight",
    "b_proj.weight",
    "g_proj.weight",
    "o_proj.weight",
]


def dims(o: Opts) -> tuple[int, int, int, int]:
    """(H, HV, K, V): q/k heads, value heads, key dim, value dim = K · expand_v."""
    return o["heads"], o["v_heads"], o["head_dim"], scaled(o["head_dim"], o["expand_v"])


@dataclass(frozen=True)
class GdnSpec(LayerSpec):
    def conv_channels(self, o: Opts) -> dict[str, int]:
        H, HV, K, V = dims(o)
        return {"q": H * K, "k": H * K, "v": HV * V}

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """q, k (H·K, D); v (HV·V, D); a, b (HV, D); g (HV·V, D) when `gate`; o (D, HV·V);
        q/k/v short convs (no bias); A_log, dt_bias (HV); o_norm (V), shared by heads (fla)."""
        H, HV, K, V = dims(o)
        D = cfg.dim
        w = {
            **qkv_weights(H * K, HV * V, D),
            "a_proj.weight": lin(HV, D),
            "b_proj.weight": lin(HV, D),
        }
        if o["gate"]:
            w["g_proj.weight"] = lin(HV * V, D)
        w["o_proj.weight"] = lin(D, HV * V)
        w |= conv_weights(self.conv_channels(o), o["conv"])
        return w | {"A_log": (HV,), "dt_bias": (HV,), "o_norm.weight": (V,)}

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """fp32 state (B, HV, K, V) + conv buffers: 4·HV·K·V + b·(W−1)·(2HK + HV·V) per sequence."""
        H, HV, K, V = dims(o)
        return state(batch, HV, K, V) | conv_cache(self.conv_channels(o), o["conv"], batch)

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        """Projections + convs; core per value head: chunked 6CK + 4CV + C²/3 + 6KV, decode 7KV."""
        H, HV, K, V = dims(o)
        proj = proj_flops(self.weights(o, cfg), PROJ)
        proj += conv_flops(sum(self.conv_channels(o).values()), o["conv"])
        core = 7 * K * V if mode == "decode" else delta_core(K, V, chunk_of(L))
        return Flops(proj=proj, core=float(HV * core))

    def window(self, o: Opts) -> int | None:
        return None

    def is_delta_rule(self) -> bool:
        return True

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        H, HV, K, V = dims(o)
        return cfg.dim + 2 * (2 * H * K + HV * V) + 3 * HV * V + 2 * HV


# fla's layer (`attn.` in its models) names its weights as we do.
HF_MAP = identity_map(*PROJ, *(f"{n}_conv1d.weight" for n in "qkv"), "A_log", "dt_bias", "o_norm.weight")


SPEC = GdnSpec(
    kind="gdn",
    summary="gated DeltaNet: delta rule with a scalar per-head decay and an output gate",
    options=(
        *COMMON,
        Option("expand_v", "number", "value head dim = head_dim · expand_v", default=2, min=0, min_open=True),
        V_HEADS,
        CONV,
        Option(
            "neg_eigval", "bool", "β ∈ (0, 2): allow negative eigenvalues of the transition", default=False
        ),
        Option("gate", "bool", "SiLU output gate through the gated RMSNorm", default=True),
        NORM_EPS,
    ),
    hf_map=HF_MAP,
    from_attention=from_attention(v="v_heads", o="v_heads"),
    module="lt2dsl.lowering.layers.gdn:GatedDeltaNet",
    source="mixers.md §5 (arXiv 2412.06464); fla `fla/layers/gated_deltanet.py`",
)
