"""Run the front end on a snippet and look at what it reports."""

from lt2dsl.diagnostics import Diagnostic
from lt2dsl.frontend import load


def diags(text: str, **overrides: str) -> list[Diagnostic]:
    """All diagnostics for `text` (with `--set` style overrides, `loop_T` for `loop.T`)."""
    sets = {k.replace("loop_T", "loop.T"): v for k, v in overrides.items()}
    return load(text if "\n" in text else text + "\n", sets).diagnostics


def codes(text: str, **overrides: str) -> list[str]:
    return [d.code for d in diags(text, **overrides)]


def errors(text: str, **overrides: str) -> list[str]:
    """Codes of the errors only (warnings left out)."""
    return [d.code for d in diags(text, **overrides) if d.is_error]


def one(text: str, code: str, **overrides: str) -> Diagnostic:
    found = [d for d in diags(text, **overrides) if d.code == code]
    got = [(d.code, d.message) for d in diags(text, **overrides)]
    assert len(found) == 1, f"expected one {code}, got {got}"
    return found[0]


def at(d: Diagnostic) -> tuple[int, int, int]:
    """(line, column, end column) of a diagnostic's primary span."""
    return d.span.line, d.span.col, d.span.end_col
