"""`deltanet`: the delta rule without decay (mixers.md §4), as fla's `DeltaNet` layer."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import Mode, Option, Opts
from lt2dsl.ir.specs.common import COMMON, CONV, NORM_EPS, from_attention, identity_map, lin, qkv_weights
from lt2dsl.ir.specs.recurrent import DeltaSpec, chunk_of, conv_weights, delta_core

PROJ = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "b_proj.weight", "g_proj.weight", "o_proj.weight"]


@dataclass(frozen=True)
class DeltaNetSpec(DeltaSpec):
    proj = tuple(PROJ)
    inputs = tuple(PROJ[:-1])

    def heads_dims(self, o: Opts) -> tuple[int, int, int, int]:
        """(H, H, K, K): one state per head, value dim = key dim."""
        H, K = o["heads"], o["head_dim"]
        return H, H, K, K

    def core(self, K: int, V: int, L: int, mode: Mode) -> float:
        """Per head: chunked 6CK + 4CV + C²/3 + 6KV, decode 6KV (mixers.md §4(d))."""
        return 6 * K * V if mode == "decode" else delta_core(K, V, chunk_of(L))

    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """In-projection GEMM, β's cast and sigmoid, the conv, the delta step, norm and o_proj."""
        return 6 + self.conv_kernels(o)

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """q, k, v (H·K, D) with K = V; b (H, D); g (H·V, D) when `gate`; o (D, H·V); convs;
        o_norm (V) (a gated RMSNorm when `gate`)."""
        H, K, D = o["heads"], o["head_dim"], cfg.dim
        w = {
            **qkv_weights(H * K, H * K, D),
            "b_proj.weight": lin(H, D),
        }
        if o["gate"]:
            w["g_proj.weight"] = lin(H * K, D)
        w["o_proj.weight"] = lin(D, H * K)
        w |= conv_weights(self.conv_channels(o), o["conv"])
        return w | {"o_norm.weight": (K,)}


# fla's layer (`attn.` in its models) names its weights as we do.
HF_MAP = identity_map(*PROJ, *(f"{n}_conv1d.weight" for n in "qkv"), "o_norm.weight")


SPEC = DeltaNetSpec(
    kind="deltanet",
    summary="DeltaNet: the delta rule (generalized Householder transitions), no decay",
    options=(
        *COMMON,
        CONV,
        Option("gate", "bool", "SiLU output gate through the gated RMSNorm", default=False),
        NORM_EPS,
    ),
    hf_map=HF_MAP,
    from_attention=from_attention(),
    module="lt2dsl.lowering.layers.deltanet:DeltaNet",
    source="mixers.md §4 (arXiv 2406.06484); fla `fla/layers/delta_net.py`",
)
