"""The Toeplitz layers of a model: every symbol's winding number and each layer's Fredholm index."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from lt2dsl.analysis.winding import SymbolRow, layer_index, layer_windings


@dataclass(frozen=True)
class ToeplitzLayer:
    """One `tmm` mixer: where it is, its shape, its symbols and its index (None: undefined)."""

    block: int
    mixer: int
    heads: int
    kernel: int
    channels: int
    length: int
    index: int | None
    symbols: list[SymbolRow]

    def to_json(self) -> dict:
        return asdict(self)


def toeplitz_layers(model: torch.nn.Module, length: int | None = None) -> list[ToeplitzLayer]:
    """Every `tmm` mixer of an `LT2Model`, its symbols cut to `length` coefficients (default all,
    i.e. max_len: the operator the layer applies to its longest sequence)."""
    out = []
    for b, block in enumerate(model.blocks):
        for j, mixer in enumerate(block.mixers):
            if getattr(mixer, "layer_kind", None) != "tmm":
                continue
            w = mixer.w.detach().to("cpu", torch.float64).numpy()
            kernel, heads, n = w.shape
            rows = layer_windings(w, b, length)
            C = model.config.dim
            idx = layer_index(rows, C, heads)
            out.append(ToeplitzLayer(b, j, heads, kernel, C, min(length or n, n), idx, rows))
    return out
