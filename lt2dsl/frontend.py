"""The front end as one call: source → parse → overrides → validate → resolve, with every diagnostic.

`load(source, overrides)` never raises for bad user input; it returns a `Loaded` whose `model` is
None when there are errors. `load_or_raise` raises `DiagnosticError` instead (the Python API).

`load` is the one driver of the front-end passes, which a `PassManager` runs in order on a
`Unit` (one source on its way through them):

* `parse`: the text → `Program` (syntax errors);
* `overrides`: the `--set` values parsed and applied to the program (E0902); stops here after a
  syntax error or a bad value, as checking without them would report noise;
* `validate`: the surface rules on the program as written; stops on an error;
* `resolve`: the program → resolved `Model`;
* `validate-resolved`: the shape rules on the model, then the kernel rules.

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from lt2dsl.diagnostics import Diagnostic, DiagnosticError, error, render_all, sort_diagnostics
from lt2dsl.env import debug_level
from lt2dsl.grammar.parse import parse
from lt2dsl.ir import nodes as n
from lt2dsl.passes.manager import FunctionPass, PassManager, PassResult
from lt2dsl.passes.overrides import applicable, apply_overrides, check_loop_override, parse_overrides
from lt2dsl.passes.resolve import resolve
from lt2dsl.source import BOM, MAX_SOURCE_BYTES, SourceFile, decode_source
from lt2dsl.validate import check, check_resolved
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


def _trace(name: str, seconds: float, unit: object) -> None:
    level = debug_level()
    if level >= 1:
        print(f"lt2dsl: pass `{name}` {1000 * seconds:.2f} ms", file=sys.stderr)
    ir = unit.ir if isinstance(unit, Unit) else None
    if level >= 2 and ir is not None:
        from lt2dsl.ir.printer import print_program

        text = print_program(ir) if isinstance(ir, n.Program) else repr(ir)
        print(f"lt2dsl: IR after `{name}`:\n{text}", file=sys.stderr)


# ---- the passes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """One source on its way through the front-end passes: each pass fills in what it made."""

    name: str
    text: str | None
    given: Mapping[str, str | n.Node]  # the overrides as given
    sources: dict[str, SourceFile]
    program: n.Program | None = None  # as written
    overrides: dict[str, n.Node] = field(default_factory=dict)  # the values of `given`
    applied: n.Program | None = None  # `program` with the overrides applied
    model: n.Model | None = None

    @property
    def ir(self) -> n.Program | n.Model | None:
        """The latest IR made so far."""
        return self.model or self.applied or self.program


def _parse(u: Unit) -> PassResult[Unit]:
    program, diags = parse(u.text, u.name)
    return PassResult(replace(u, program=program), tuple(diags))


def _overrides(u: Unit) -> PassResult[Unit]:
    values, diags = parse_overrides(u.given, u.sources)
    if u.program is not None:
        diags += list(check_loop_override(u.program, values))
    if u.program is None or diags:
        return PassResult(replace(u, overrides=values), tuple(diags), halt=True)
    applied = apply_overrides(u.program, applicable(values))
    return PassResult(replace(u, overrides=values, applied=applied))


def _validate(u: Unit) -> PassResult[Unit]:
    diags = check(u.applied, u.overrides)
    return PassResult(u, tuple(diags), halt=any(d.is_error for d in diags))


def _resolve(u: Unit) -> PassResult[Unit]:
    return PassResult(replace(u, model=resolve(u.applied)))


def _validate_resolved(u: Unit) -> PassResult[Unit]:
    return PassResult(u, tuple(check_resolved(u.applied, u.model, u.overrides)))


PASSES = (
    FunctionPass("parse", _parse),
    FunctionPass("overrides", _overrides),
    FunctionPass("validate", _validate),
    FunctionPass("resolve", _resolve),
    FunctionPass("validate-resolved", _validate_resolved),
)


def _run(unit: Unit, passes=PASSES) -> Loaded:
    result = PassManager(passes, after_pass=_trace).run(unit)
    u, diags = result.value, sort_diagnostics(result.diagnostics)
    model = None if any(d.is_error for d in diags) else u.model
    return Loaded(u.program, model, diags, u.sources, u.overrides, u.name)


# ---- entry points --------------------------------------------------------------------------------


def load(source: str | os.PathLike, overrides: Mapping[str, str | n.Node] | None = None) -> Loaded:
    """Parse, validate and resolve `source` (a path or `.lt2` text, see the module docstring)."""
    name, text, diags = read_source(source)
    sources = {} if text is None else {name: SourceFile(name=name, text=text)}
    if text is None:
        return Loaded(None, None, diags, sources, name=name)
    return _run(Unit(name, text, dict(overrides or {}), sources))


def check_program(program: n.Program, overrides: Mapping[str, str | n.Node] | None = None) -> Loaded:
    """The passes after `parse` on an already parsed `program`: every diagnostic, and the model
    when there is no error."""
    name = program.span.file or TEXT_NAME
    return _run(Unit(name, None, dict(overrides or {}), {}, program=program), PASSES[1:])


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
    """(name, text, diagnostics): text is None when the source cannot be used (E0901, E0903)."""
    if not is_path(source):
        text = str(source)
        if problems := list(check_size(TEXT_NAME, len(text.encode("utf-8", "surrogatepass")))):
            return TEXT_NAME, None, problems
        return TEXT_NAME, text.removeprefix(BOM), []
    name = os.fspath(source)
    path = Path(name)
    why = "no such file" if not path.exists() else None if path.is_file() else "not a file"
    if why is None:
        try:
            return (name, *source_text(path.read_bytes(), name))
        except OSError as e:
            why = e.strerror or type(e).__name__
    return name, None, list(check_readable(name, why))


def source_text(data: bytes, name: str) -> tuple[str | None, list[Diagnostic]]:
    """(text, []) for the bytes of a source file, else (None, the E0901 / E0903 diagnostic)."""
    if problems := list(check_size(name, len(data))):
        return None, problems
    text, why = decode_source(data)
    return text, [] if why is None else list(check_readable(name, why))


@rule("E0901")
def check_readable(name: str, why: str) -> Iterator[Diagnostic]:
    """Source file cannot be read.

    What it checks:
        The `.lt2` file exists, is a file and holds UTF-8 text (a byte-order mark at the start
        is accepted): a NUL byte or an invalid UTF-8 sequence marks a binary file. The command
        line reports a missing file as a usage error, exit code 2.

    Why it matters:
        There is nothing to compile.

    Example:
        lt2dsl.load("missing.lt2")

    Use instead:
        lt2dsl.load("examples/lt2_hybrid_gdn_dsa.lt2")
    """
    help_ = "check the path" if why in ("no such file", "not a file") else "save the file as UTF-8 text"
    yield error("E0901", f"cannot read `{name}`: {why}", help=help_)


@rule("E0903")
def check_size(name: str, size: int) -> Iterator[Diagnostic]:
    """Source too large.

    What it checks:
        A `.lt2` source (a file, standard input or text given to `lt2dsl.load`) is at most
        128 KiB.

    Why it matters:
        A real model's description is a few kilobytes, even written one block per line; a
        larger source is generated or not a model, and checking it would take minutes and
        gigabytes before saying so.

    Example:
        lt2dsl check blocks_written_out_one_million_times.lt2

    Use instead:
        loop T=4 < gdn; gdn; gdn; dsa >
    """
    if size > MAX_SOURCE_BYTES:
        yield error(
            "E0903",
            f"`{name}` is too large to be a `.lt2` source ({size:,} bytes)",
            help=f"lt2dsl reads sources of at most {MAX_SOURCE_BYTES:,} bytes (128 KiB); write repeated "
            "blocks with `repeat n < ... >`, `block * n` or `loop T=n < ... >`",
        )
