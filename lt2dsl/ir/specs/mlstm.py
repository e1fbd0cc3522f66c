"""`mlstm`: xLSTM matrix memory (mixers.md §8), parameterized as the xLSTM-7B layer."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import CacheTensor, Flops, LayerSpec, Mode, Option, Opts, scaled
from lt2dsl.ir.specs.common import COMMON, from_attention, lin, proj_flops, qkv_weights
from lt2dsl.ir.specs.recurrent import chunk_of, decay_core

PROJ = [
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "ogate.weight",
    "igate.weight",
    "fgate.weight",
    "out_proj.weight",
]


def dims(o: Opts) -> tuple[int, int, int]:
    """(H, K, V): V = head_dim, K = head_dim · qk_dim_factor."""
    return o["heads"], scaled(o["head_dim"], o["qk_dim_factor"]), o["head_dim"]


@dataclass(frozen=True)
class MlstmSpec(LayerSpec):
    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """In-projection GEMM, the gates' torch ops, the recurrent step, the output norm and gate,
        o_proj."""
        return 18

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """q, k (H·K, D); v and the sigmoid output gate (H·V, D); input and forget gates (H, D)
        with biases; per-head LayerNorm weight (H·V); out_proj (D, H·V)."""
        H, K, V = dims(o)
        D = cfg.dim
        return {
            **qkv_weights(H * K, H * V, D),
            "ogate.weight": lin(H * V, D),
            "igate.weight": lin(H, D),
            "igate.bias": (H,),
            "fgate.weight": lin(H, D),
            "fgate.bias": (H,),
            "norm.weight": (H * V,),
            "out_proj.weight": lin(D, H * V),
        }

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """(C, n, m): (B, H, K, V), (B, H, K), (B, H), all in the state dtype."""
        H, K, V = dims(o)
        return {
            "C": CacheTensor((batch, H, K, V), "state", "state"),
            "n": CacheTensor((batch, H, K), "state", "state"),
            "m": CacheTensor((batch, H), "state", "state"),
        }

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        """Core per head: chunked 2C(K+V) + 4KV + 4K + C, decode 5KV + 5K (mixers.md §8(d))."""
        H, K, V = dims(o)
        C = chunk_of(L)
        core = 5 * K * V + 5 * K if mode == "decode" else decay_core(K, V, C) + 4 * K + C
        return Flops(proj=proj_flops(self.weights(o, cfg), PROJ), core=float(H * core))

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """The chunk op's q, k `[T, H, K]`, v and its output `[T, H, V]`, fp32 i, f and the
        per-token stabiliser terms `[T, H]` (`kernels/mlstm/ops.py`); the fp32 tanh outputs of the
        soft cap `[T, H]`; the fp32 per-head LayerNorm's input `[T, H, V]`, mean and rstd `[T, H]`
        and the fp32 normed output its weight multiplies; the σ(o-gate) ⊙ norm product's two
        factors and out_proj's input `[T, H, V]`: 2HK + 9HV + 16H."""
        H, K, V = dims(o)
        return 2 * H * K + 9 * H * V + 16 * H


SPEC = MlstmSpec(
    kind="mlstm",
    summary="xLSTM mLSTM: matrix memory with exponential input gate, stabilizer and normalizer",
    options=(
        *COMMON,
        Option(
            "qk_dim_factor",
            "number",
            "key head dim = head_dim · qk_dim_factor",
            default=0.5,
            min=0,
            min_open=True,
        ),
        Option(
            "gate_cap",
            "float",
            "soft cap of the gate pre-activations: cap·tanh(x/cap)",
            default=15,
            min=0,
            min_open=True,
        ),
    ),
    from_attention=from_attention(out="out_proj.weight"),
    module="lt2dsl.lowering.layers.mlstm:MLSTM",
    source="mixers.md §8 (arXiv 2503.13427, xLSTM-7B); NX-AI/xlstm `xlstm_large/model.py`",
)
