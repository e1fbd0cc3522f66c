"""Probes of trained models: the Toeplitz mixer's winding numbers and Fredholm index
(`winding.py`, `toeplitz.py`), the rank and receptive field of recurrent states (`state.py`);
`lt2dsl analyze` prints them (`cli.py`). User guide: docs/tasks.md.
"""

from __future__ import annotations

from lt2dsl.analysis.winding import Winding, layer_index, layer_windings, winding_number

__all__ = ["Winding", "layer_index", "layer_windings", "winding_number"]
