"""The `.lt2` front end: `parse(text) -> (Program | None, diagnostics)` and `parse_value(text)`."""

from lt2dsl.grammar.parse import parse, parse_value

__all__ = ["parse", "parse_value"]
