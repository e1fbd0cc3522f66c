"""`kda`: Kimi delta attention, channel-wise decay (mixers.md §6), as fla's `KimiDeltaAttention`."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import Option, Opts
from lt2dsl.ir.specs.common import COMMON, CONV, NORM_EPS, V_HEADS, identity_map, lin, qkv_weights
from lt2dsl.ir.specs.recurrent import GvaDeltaSpec, conv_weights, gva_dims

PROJ = [
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "f_proj.0.weight",
    "f_proj.1.weight",
    "b_proj.weight",
    "g_proj.0.weight",
    "g_proj.1.weight",
    "o_proj.weight",
]
SUB = 16  # sub-chunk of the gated diagonal blocks


@dataclass(frozen=True)
class KdaSpec(GvaDeltaSpec):
    """Core per value head: GDN's chunked count + 3·16·K for the gated 16-token diagonal
    sub-blocks (mixers.md §6(d)); decode 7KV."""

    proj = tuple(PROJ)
    sub = SUB
    extra_scores = 1
    inputs = (
        "q_proj.weight",
        "k_proj.weight",
        "v_proj.weight",
        "f_proj.0.weight",
        "b_proj.weight",
        "g_proj.0.weight",
    )

    def gate_width(self, o: Opts) -> int:
        return o["head_dim"]

    def gate_saved(self, o: Opts) -> int:
        """The output gate's second projection `[T, HV, V]` (the gated norm keeps it), and the
        fp32 softplus input and output of the forget gate `[T, HV, K]` (measured; `safe_gate`'s
        sigmoid path is counted the same, unmeasured)."""
        H, HV, K, V = gva_dims(o)
        return HV * V + 4 * HV * K

    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """In-projection and f_proj's second GEMM, the gate math (nine torch ops), the conv, the
        delta step, g_proj's second GEMM, gated norm and o_proj."""
        return 16 + self.conv_kernels(o)

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """q, k (H·K, D); v (HV·V, D) with V = K · expand_v; low-rank forget gate f: D → V → HV·K;
        b (HV, D); low-rank output gate g: D → V → HV·V (+ bias); o (D, HV·V); convs;
        A_log (HV); dt_bias (HV·K); o_norm (V)."""
        H, HV, K, V = gva_dims(o)
        D = cfg.dim
        w = {
            **qkv_weights(H * K, HV * V, D),
            "f_proj.0.weight": lin(V, D),
            "f_proj.1.weight": lin(HV * K, V),
            "b_proj.weight": lin(HV, D),
            "g_proj.0.weight": lin(V, D),
            "g_proj.1.weight": lin(HV * V, V),
            "g_proj.1.bias": (HV * V,),
            "o_proj.weight": lin(D, HV * V),
        }
        w |= conv_weights(self.conv_channels(o), o["conv"])
        return w | {"A_log": (HV,), "dt_bias": (HV * K,), "o_norm.weight": (V,)}


# fla's layer (`attn.` in its models) names its weights as we do.
HF_MAP = identity_map(
    *PROJ, "g_proj.1.bias", *(f"{n}_conv1d.weight" for n in "qkv"), "A_log", "dt_bias", "o_norm.weight"
)


SPEC = KdaSpec(
    kind="kda",
    summary="Kimi delta attention: delta rule with channel-wise (per key dim) decay",
    options=(
        *COMMON,
        V_HEADS,
        Option(
            "expand_v",
            "number",
            "value head dim = head_dim · expand_v (fla's KDA)",
            default=1,
            min=0,
            min_open=True,
        ),
        CONV,
        Option("safe_gate", "bool", "bounded gate g = lower_bound · σ(·) ∈ (lower_bound, 0)", default=False),
        Option(
            "lower_bound",
            "float",
            "lower bound of the per-step log decay with `safe_gate`",
            default=-5.0,
            max=0,
            max_open=True,
        ),
        NORM_EPS,
    ),
    hf_map=HF_MAP,
    module="lt2dsl.lowering.layers.kda:KimiDeltaAttention",
    source="mixers.md §6 (arXiv 2510.26692); fla `fla/layers/kda.py`",
)
