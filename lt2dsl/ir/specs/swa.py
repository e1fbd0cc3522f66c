"""`swa` (alias `window`): sliding-window softmax attention (mixers.md §9).

Key j is visible to query t iff t − w + 1 ≤ j ≤ t: a window of w keys including itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.spec import Mode, Opts
from lt2dsl.ir.specs.common import ATTENTION, ATTENTION_HF, COMMON, causal_mean
from lt2dsl.ir.specs.full import FROM_ATTENTION, HF_MAP, SWA_OPTIONS, FullSpec


@dataclass(frozen=True)
class SwaSpec(FullSpec):
    def kv_len(self, o: Opts, L: int) -> int:
        """Ring buffer of the last w keys/values (rotated keys), capped at the window."""
        return min(L, o["window"])

    def visible(self, o: Opts, L: int, mode: Mode, causal: str) -> float:
        w = o["window"]
        if mode == "decode":
            return float(min(L, w))
        if causal == "full":
            return float(L)  # the whole square, as a masked dense product (and FlopCounterMode) counts
        return causal_mean(L, w)

    def window(self, o: Opts) -> int | None:
        return o["window"] - 1


SPEC = SwaSpec(
    kind="swa",
    aliases=("window",),
    summary="sliding-window softmax attention (w keys including self)",
    options=(*COMMON, *SWA_OPTIONS, *ATTENTION, *ATTENTION_HF),
    module="lt2dsl.lowering.layers.attention:Attention",
    hf_map=HF_MAP,
    from_attention=FROM_ATTENTION,
    source="mixers.md §9; fla `fla/ops/attn/naive.py` window convention",
)
