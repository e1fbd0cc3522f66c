"""The front end as one call: source → parse → validate → resolve, with every diagnostic.

`load(source, overrides)` never raises for bad user input; it returns a `Loaded` whose `model` is
None when there are errors. `load_or_raise` raises `DiagnosticError` instead (the Python API).

`source` is a path or `.lt2` text:
* an `os.PathLike` is always a path;
* a `str` is text when it contains a newline or `<`; otherwise it is a path when such a file
  exists, or when it ends in `.lt2` (a missing `.lt2` file is reported as E0901, not parsed
  as text); anything else is text (`load("gdn")` is a one-block program).

`LT2_DEBUG=1` prints each pass with its time to stderr, `LT2_DEBUG=2` also the IR after it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lt2dsl.diagnostics import Diagnostic, DiagnosticError, error, render_all, sort_diagnostics
from lt2dsl.grammar.parse import parse, parse_value
from lt2dsl.ir import nodes as n
from lt2dsl.source import SourceFile, Span
from lt2dsl.validate import check
from lt2dsl.validate.rules import rule

TEXT_NAME = "<input>"


@dataclass
class Loaded:
    """What the front end made of one source: the program, the model (None on errors), every
    diagnostic in source order, and the texts the diagnostics quote."""

    program: n.Program | None
    model: n.Model | None
    diagnostics: list[Diagnostic]
    sources: dict[str, SourceFile]
    overrides: dict[str, n.Node] = field(default_factory=dict)
    name: str = TEXT_NAME

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    @property
    def ok(self) -> bool:
        return not self.errors

    def render(self) -> str:
        return render_all(self.diagnostics, self.sources)


def debug_level() -> int:
    try:
        return int(os.environ.get("LT2_DEBUG", "0") or 0)
    except ValueError:
        return 1


def _trace(name: str, t0: float, ir: object = None) -> None:
    level = debug_level()
    if level >= 1:
        print(f"lt2dsl: pass `{name}` {1000 * (time.perf_counter() - t0):.2f} ms", file=sys.stderr)
    if level >= 2 and ir is not None:
        from lt2dsl.ir.printer import print_program

        text = print_program(ir) if isinstance(ir, n.Program) else repr(ir)
        print(f"lt2dsl: IR after `{name}`:\n{text}", file=sys.stderr)


def load(source: str | os.PathLike, overrides: Mapping[str, str | n.Node] | None = None) -> Loaded:
    """Parse, validate and resolve `source` (a path or `.lt2` text, see the module docstring)."""
    name, text, diags = read_source(source)
    sources = {} if text is None else {name: SourceFile(name=name, text=text)}
    if text is None:
        return Loaded(None, None, diags, sources, name=name)
    values, odiags = parse_overrides(overrides or {}, sources)
    t0 = time.perf_counter()
    program, pdiags = parse(text, name)
    _trace("parse", t0, program)
    if program is None or odiags:
        # like a syntax error in the file: checking without the override would report noise
        return Loaded(program, None, sort_diagnostics(pdiags + odiags), sources, values, name)
    t0 = time.perf_counter()
    vdiags, model = check(program, values)
    _trace("validate+resolve", t0, model)
    diags = sort_diagnostics(vdiags + odiags)
    if any(d.is_error for d in diags):
        model = None
    return Loaded(program, model, diags, sources, values, name)


def load_or_raise(source: str | os.PathLike, overrides: Mapping[str, str | n.Node] | None = None) -> Loaded:
    """`load`, raising `DiagnosticError` (with all diagnostics) when there is an error."""
    loaded = load(source, overrides)
    if not loaded.ok:
        raise DiagnosticError(loaded.diagnostics, loaded.sources)
    return loaded


def is_path(source: str | os.PathLike) -> bool:
    if isinstance(source, os.PathLike):
        return True
    if "\n" in source or "<" in source:
        return False
    return os.path.isfile(source) or source.endswith(".lt2")


def read_source(source: str | os.PathLike) -> tuple[str, str | None, list[Diagnostic]]:
    """(name, text, diagnostics): text is None when the file cannot be read (E0901)."""
    if not is_path(source):
        return TEXT_NAME, str(source), []
    name = os.fspath(source)
    problems = list(check_readable(Path(name)))
    if problems:
        return name, None, problems
    return name, Path(name).read_text(encoding="utf-8"), []


@rule("E0901")
def check_readable(path: Path) -> Iterator[Diagnostic]:
    """Source file cannot be read.

    What it checks:
        The `.lt2` file given to `lt2dsl.load` exists, is a file and holds UTF-8 text. (The
        command line reports a missing file as a usage error, exit code 2.)

    Why it matters:
        There is nothing to compile.

    Example:
        lt2dsl.load("missing.lt2")

    Use instead:
        lt2dsl.load("examples/lt2_hybrid_gdn_dsa.lt2")
    """
    why = None
    if not path.exists():
        why = "no such file"
    elif not path.is_file():
        why = "not a file"
    else:
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            why = "not UTF-8 text"
        except OSError as e:
            why = e.strerror or type(e).__name__
    if why:
        yield error("E0901", f"cannot read `{path}`: {why}", help="check the path")


def parse_overrides(
    overrides: Mapping[str, str | n.Node], sources: dict[str, SourceFile]
) -> tuple[dict[str, n.Node], list[Diagnostic]]:
    """`--set` overrides as value nodes; a text value is parsed with the `.lt2` value syntax and
    registered as a one-line source `--set KEY` so its diagnostics can quote it."""
    values: dict[str, n.Node] = {}
    diags: list[Diagnostic] = []
    for key, raw in overrides.items():
        if isinstance(raw, n.Node):
            values[key] = raw
            continue
        src = SourceFile(name=f"--set {key}", text=f"{key}={raw}")
        sources[src.name] = src
        problems = list(check_override_value(key, str(raw), src.name))
        if problems:
            diags += problems
        else:
            values[key] = parse_value(str(raw), src.name, col=len(key) + 2)
    return values, diags


@rule("E0902")
def check_override_value(key: str, raw: str, file: str) -> Iterator[Diagnostic]:
    """Invalid `--set` value.

    What it checks:
        The value of `--set key=value` is one `.lt2` value: a number (`1024`, `32k`, `8/3`,
        `1e-6`), `true`/`false`, `none`, a string, a name or a call (`swiglu(hidden=8k)`).

    Why it matters:
        Overrides use the same value syntax as the file, so they mean the same thing.

    Example:
        lt2dsl check model.lt2 --set dim=1k2

    Use instead:
        lt2dsl check model.lt2 --set dim=1024
    """
    try:
        parse_value(raw, file, col=len(key) + 2)
    except ValueError as e:
        col = len(key) + 2
        span = Span(file=file, line=1, col=col, end_line=1, end_col=col + max(len(raw), 1))
        yield error(
            "E0902",
            f"invalid value for `--set {key}`",
            span,
            label=str(e).split(": ", 1)[-1],
            help="values are written as in a `.lt2` file: `1024`, `32k`, `true`, `sdpa`, `swiglu(hidden=8k)`",
        )
