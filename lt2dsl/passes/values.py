"""Python values of IR value nodes, and overrides given on the command line (`--set k=v`)."""

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


def parse_override(text: str) -> tuple[str, n.Node]:
    """`key=value` → (key, value node). Values: integers with k/M, floats, fractions, booleans,
    `none`, names and simple calls — parsed with the .lt2 grammar so the rules are the same."""
    if "=" not in text:
        raise ValueError(f"--set expects key=value, got {text!r}")
    key, _, raw = text.partition("=")
    from lt2dsl.grammar.parse import parse_value  # the grammar owns value syntax

    return key.strip(), parse_value(raw.strip())
