"""The one way a user hears about a problem: `Diagnostic`, rendered in rustc's format.

```
error[E0101]: unknown layer `dsaa`
 --> examples/hybrid.lt2:1:17
  |
1 | loop T=4 < gdn; dsaa(topk=64); full(gate=sdpa) >
  |                 ^^^^ not a registered layer
  |
help: a layer with a similar name exists: `dsa`
```
Messages are lowercase, without a final period, with code in backticks; only `help` proposes a fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from lt2dsl.source import NOWHERE, SourceFile, Span


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


class Label(BaseModel):
    """A secondary span with its own short message (e.g. "first defined here")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    span: Span
    message: str = ""


class Diagnostic(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    severity: Severity
    code: str
    message: str
    span: Span = NOWHERE
    label: str = ""
    labels: tuple[Label, ...] = ()
    notes: tuple[str, ...] = ()
    help: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple:
        return (*self.span.key(), self.span.end_col, self.code)


def error(code: str, message: str, span: Span = NOWHERE, **kw) -> Diagnostic:
    return Diagnostic(severity=Severity.ERROR, code=code, message=message, span=span, **kw)


def warning(code: str, message: str, span: Span = NOWHERE, **kw) -> Diagnostic:
    return Diagnostic(severity=Severity.WARNING, code=code, message=message, span=span, **kw)


class DiagnosticError(Exception):
    """Raised by the API (not the CLI) when a program has errors; carries all of them."""

    def __init__(self, diagnostics: list[Diagnostic], sources: Mapping[str, SourceFile] | None = None):
        self.diagnostics = diagnostics
        self.sources = dict(sources or {})
        super().__init__(render_all(diagnostics, self.sources))


def sort_diagnostics(diags: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Source order, duplicates (same code, message and position) dropped."""
    seen, out = set(), []
    for d in sorted(diags, key=Diagnostic.sort_key):
        k = (d.code, d.message, d.span.key(), d.span.end_col)
        if k not in seen:
            seen.add(k)
            out.append(d)
    return out


# A quoted source line longer than this is cut to a window around its span.
MAX_LINE = 100
# More diagnostics than this of one code are summarised in one line (warnings sooner).
MAX_SAME = {Severity.ERROR: 20, Severity.WARNING: 3, Severity.NOTE: 3}


def visible(text: str) -> str:
    """`text` safe to print: a tab becomes a space and other control characters (NUL, ESC, …)
    their Unicode control pictures (␀, ␛), each one column wide so carets still line up;
    invisible format characters (a BOM, a bidirectional override) become U+FFFD."""
    if text.isprintable():
        return text
    return "".join(_visible_char(c) for c in text)


def _visible_char(c: str) -> str:
    if c.isprintable() or c == "\n":
        return c
    if c == "\t":
        return " "
    o = ord(c)
    if o < 0x20:
        return chr(0x2400 + o)
    return "\u2421" if o == 0x7F else "\ufffd"


def render(d: Diagnostic, sources: Mapping[str, SourceFile]) -> str:
    head = f"{d.severity.value}[{d.code}]: {visible(d.message)}"
    lines = [head]
    spans = [(d.span, d.label, "^")] + [(lb.span, lb.message, "-") for lb in d.labels]
    spans = [s for s in spans if s[0].known]
    width = max((len(str(s.end_line or s.line)) for s, _, _ in spans), default=1)
    pad = " " * width
    if d.span.known:
        lines.append(f"{pad}--> {visible(str(d.span))}")
    if spans:
        lines.append(f"{pad} |")
        for span, msg, mark in sorted(spans, key=lambda s: s[0].key()):
            lines += _snippet(span, visible(msg), mark, sources.get(span.file), width)
        lines.append(f"{pad} |")
    lines += [f"{pad} = note: {visible(n)}" for n in d.notes]
    if d.help:
        lines.append(f"help: {visible(d.help)}")
    return "\n".join(lines)


def _snippet(span: Span, msg: str, mark: str, src: SourceFile | None, width: int) -> list[str]:
    text = visible(src.line(span.line)) if src else ""
    start = max(span.col, 1)
    if span.end_line == span.line and span.end_col > span.col:
        n = span.end_col - span.col
    else:  # multi-line span: underline to the end of its first line
        n = max(len(text) - start + 1, 1)
    text, start, n = window(text, start, n)
    under = " " * (start - 1) + mark * n + (f" {msg}" if msg else "")
    return [f"{span.line:>{width}} | {text}".rstrip(), f"{' ' * width} | {under}".rstrip()]


def window(text: str, start: int, n: int, limit: int = MAX_LINE) -> tuple[str, int, int]:
    """A line of at most about `limit` columns around columns [start, start + n): the line cut
    on either side with `…`, the span's start column moved to match and its length capped."""
    if len(text) <= limit:
        return text, start, n
    n = min(n, limit // 2)
    left = max(0, min(start - 1 - limit // 4, len(text) - limit))
    cut = text[left : left + limit]
    head = "…" if left > 0 else ""
    tail = "…" if left + limit < len(text) else ""
    return head + cut + tail, start - left + len(head), n


def render_all(diags: Iterable[Diagnostic], sources: Mapping[str, SourceFile]) -> str:
    diags = list(diags)
    parts = [render(d, sources) for d in shown(diags)]
    parts += summaries(diags)
    n_err = sum(d.is_error for d in diags)
    n_warn = sum(d.severity is Severity.WARNING for d in diags)
    if n_err:
        s = "s" if n_err > 1 else ""
        parts.append(
            f"error: aborting due to {n_err} previous error{s}"
            + (f"; {n_warn} warning{'s' if n_warn > 1 else ''} emitted" if n_warn else "")
        )
    return "\n\n".join(parts)


def shown(diags: list[Diagnostic]) -> list[Diagnostic]:
    """The diagnostics printed in full: the first MAX_SAME of each (severity, code)."""
    seen: dict[tuple[Severity, str], int] = {}
    out = []
    for d in diags:
        k = (d.severity, d.code)
        seen[k] = seen.get(k, 0) + 1
        if seen[k] <= MAX_SAME[d.severity]:
            out.append(d)
    return out


def summaries(diags: list[Diagnostic]) -> list[str]:
    """One line per (severity, code) with more diagnostics than are printed in full."""
    counts: dict[tuple[Severity, str], int] = {}
    for d in diags:
        counts[(d.severity, d.code)] = counts.get((d.severity, d.code), 0) + 1
    out = []
    for (sev, code), count in counts.items():
        if (more := count - MAX_SAME[sev]) > 0:
            out.append(
                f"{sev.value}[{code}]: {more} more like the above, not shown\n"
                f"  = note: `lt2dsl explain {code}` describes them"
            )
    return out
