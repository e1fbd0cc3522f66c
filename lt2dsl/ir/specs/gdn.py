"""`gdn`: gated DeltaNet (mixers.md §5), parameterized as fla's `GatedDeltaNet` layer."""

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
    "a_proj.weight",
    "b_proj.weight",
    "g_proj.weight",
    "o_proj.weight",
]


@dataclass(frozen=True)
class GdnSpec(GvaDeltaSpec):
    """Core per value head: chunked 6CK + 4CV + C²/3 + 6KV, decode 7KV (no sub-chunks)."""

    proj = tuple(PROJ)
    inputs = tuple(PROJ[:-1])

    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """In-projection GEMM, the conv, the gated delta step, gated norm and o_proj."""
        return 4 + self.conv_kernels(o)

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """q, k (H·K, D); v (HV·V, D); a, b (HV, D); g (HV·V, D) when `gate`; o (D, HV·V);
        q/k/v short convs (no bias); A_log, dt_bias (HV); o_norm (V), shared by heads (fla)."""
        H, HV, K, V = gva_dims(o)
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

    def gate_width(self, o: Opts) -> int:
        return 1


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
        Option(
            "dt_max",
            "float",
            "init: dt_bias = softplus⁻¹(dt), dt log-uniform in [dt_max/100, dt_max]; a smaller "
            "dt_max keeps the state longer at init (memory ≈ 1/(A·dt) tokens; fla: 0.1)",
            default=0.1,
            min=0,
            max=1,
            min_open=True,
        ),
    ),
    hf_map=HF_MAP,
    module="lt2dsl.lowering.layers.gdn:GatedDeltaNet",
    source="mixers.md §5 (arXiv 2412.06464); fla `fla/layers/gated_deltanet.py`",
)
