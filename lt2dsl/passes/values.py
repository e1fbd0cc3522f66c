"""Python values of IR value nodes."""

from __future__ import annotations

from typing import Any

from lt2dsl.ir import nodes as n


def py(v: n.Node) -> Any:
    """The Python value of a value node; calls and names stay nodes/strings for the caller."""
    match v:
        case n.Int() | n.Float() | n.Str() | n.Bool():
            return v.value
        case n.Frac():
            return v.value
        case n.NoneVal():
            return None
        case n.Name():
            return v.value
        case _:
            return v
