"""`lt2dsl`: check, fmt, graph, explain and compile `.lt2` files; import HF checkpoints; eval and
analyze trained weights; bench and warm up decoding.

Exit codes: 0 clean (warnings allowed), 1 the input has errors (or `fmt --check` would change a
file), 2 usage errors (bad flags, a missing file, an unknown code), 3 an internal compiler error.
Diagnostics go to stderr in rustc's format, plain text unless stderr is a terminal. No input
makes the CLI print a Python traceback: an internal failure is reported as E9999, with the
traceback only under `LT2_DEBUG=1`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from lt2dsl.diagnostics import Diagnostic, render_all, sort_diagnostics, visible
from lt2dsl.env import debug_level
from lt2dsl.source import SourceFile
from lt2dsl.validate.rules import rule

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_ICE = 0, 1, 2, 3
STYLES = {"error": "bold red", "warning": "bold yellow", "help": "bold cyan", "note": "bold"}


class UsageError(Exception):
    """Bad command-line use: reported as `error: ...` with exit code 2."""


# ---- output -------------------------------------------------------------------------------------


def consoles() -> tuple[Console, Console]:
    """(stdout, stderr) consoles, made per call so redirected streams are honoured."""
    kw = dict(highlight=False, emoji=False, markup=False, soft_wrap=True)
    return Console(file=sys.stdout, **kw), Console(file=sys.stderr, **kw)


def emit(console: Console, text: str) -> None:
    """Print plain text (control characters a file name or flag may hold made visible); on a
    terminal, colour the `error:`/`warning:`/`help:` heads."""
    if not text:
        return
    text = visible(text)
    if not console.is_terminal:
        console.file.write(text + "\n")
        return
    out = Text()
    for line in text.splitlines(keepends=True):
        head = line.split("[", 1)[0].split(":", 1)[0].strip()
        style = STYLES.get(head) if not line.startswith(" ") else None
        out.append(line, style=style)
    console.print(out)


def report(err: Console, diags: list[Diagnostic], sources: dict[str, SourceFile]) -> None:
    diags = sort_diagnostics(diags)
    text = render_all(diags, sources)
    n_warn = sum(not d.is_error for d in diags)
    if n_warn and not any(d.is_error for d in diags):
        text += f"\n\nwarning: {n_warn} warning{'s' if n_warn > 1 else ''} emitted"
    emit(err, text)


# ---- the commands -------------------------------------------------------------------------------


def overrides_of(args: argparse.Namespace) -> dict[str, str]:
    out = {}
    for item in getattr(args, "set", None) or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"`--set` expects KEY=VALUE, got `{item}`")
        out[key.strip()] = value.strip()
    return out


def existing(path: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"cannot read `{path}`: {'not a file' if p.exists() else 'no such file'}")
    return p


def cmd_check(args: argparse.Namespace, out: Console, err: Console) -> int:
    from lt2dsl.frontend import load

    overrides = overrides_of(args)
    diags, sources, status = [], {}, EXIT_OK
    for f in args.files:
        try:
            path = existing(f)
        except UsageError as e:
            emit(err, f"error: {e}")
            status = EXIT_USAGE
            continue
        loaded = load(path, overrides)
        diags += loaded.diagnostics
        sources |= loaded.sources
    report(err, diags, sources)
    if status == EXIT_OK and any(d.is_error for d in diags):
        status = EXIT_ERRORS
    return status


def cmd_fmt(args: argparse.Namespace, out: Console, err: Console) -> int:
    from lt2dsl.frontend import read_source, source_text

    status = EXIT_OK
    for f in args.files:
        if f == "-":
            name, (text, diags) = "<stdin>", source_text(stdin_bytes(), "<stdin>")
        else:
            name, text, diags = read_source(existing(f))
        if text is not None:
            formatted, diags = format_text(text, name)
        if text is None or formatted is None:
            report(err, diags, {} if text is None else {name: SourceFile(name=name, text=text)})
            status = max(status, EXIT_ERRORS)
        elif f == "-":
            out.file.write(formatted)
        elif formatted != text and args.check:
            emit(err, f"would reformat {f}")
            status = max(status, EXIT_ERRORS)
        elif formatted != text:
            write_atomically(Path(f), formatted)
            emit(err, f"reformatted {f}")
    return status


def stdin_bytes() -> bytes:
    """Standard input as bytes (decoded by `source_text` like a file's)."""
    if hasattr(sys.stdin, "buffer"):
        return sys.stdin.buffer.read()
    return sys.stdin.read().encode("utf-8", "surrogateescape")


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: a reader (or
    a crash) never sees half a file."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def format_text(text: str, name: str) -> tuple[str | None, list[Diagnostic]]:
    """The canonical text, or (None, syntax errors). Refuses to change a program's meaning."""
    from lt2dsl.grammar.parse import parse
    from lt2dsl.ir.printer import print_program

    program, diags = parse(text, name)
    if program is None:
        return None, diags
    formatted = print_program(program)
    again, _ = parse(formatted, name)
    if again != program:
        raise AssertionError(f"internal error in `fmt`: printing {name} changed its meaning")
    return formatted, []


def cmd_graph(args: argparse.Namespace, out: Console, err: Console) -> int:
    from lt2dsl.frontend import load
    from lt2dsl.ir.graph import to_dot, to_graph, to_text

    loaded = load(existing(args.file), overrides_of(args))
    report(err, loaded.diagnostics, loaded.sources)
    if loaded.model is None:
        return EXIT_ERRORS
    g = to_graph(loaded.model)
    out.file.write((to_dot(g) if args.dot else to_text(g)) + "\n")
    return EXIT_OK


def cmd_explain(args: argparse.Namespace, out: Console, err: Console) -> int:
    from lt2dsl.docs import explain
    from lt2dsl.suggest import nearby, quoted
    from lt2dsl.validate.rules import all_rules

    code = args.code.strip().upper()
    rules = all_rules()
    if code not in rules:
        close = nearby(code, list(rules))
        hint = (
            f"did you mean {quoted(close)}?"
            if close
            else "codes look like `E0101`; the list is in docs/language.md"
        )
        raise UsageError(f"unknown diagnostic code `{args.code}`; {hint}")
    out.file.write(explain(code) + "\n")
    return EXIT_OK


def cmd_compile(args: argparse.Namespace, out: Console, err: Console) -> int:
    from lt2dsl.frontend import load

    args.overrides = overrides_of(args)  # `--vs FILE` gets the same overrides (cost.cli)
    loaded = load(existing(args.file), args.overrides)
    report(err, loaded.diagnostics, loaded.sources)
    if loaded.model is None:
        return EXIT_ERRORS
    status = EXIT_OK
    if args.estimate:
        cost = _optional("lt2dsl.cost.cli", "--estimate")
        status = max(status, cost.run(loaded, args, out))
    if args.emit == "fx":
        lowering = _optional("lt2dsl.lowering.cli", "--emit fx")
        status = max(status, lowering.emit_fx(loaded, args, out))
    if not args.estimate and args.emit is None:
        out.file.write(summary(loaded) + "\n")
    return status


def cmd_import(args: argparse.Namespace, out: Console, err: Console) -> int:
    folder = Path(args.dir)
    if not folder.is_dir():
        raise UsageError(f"cannot read `{folder}`: {'not a folder' if folder.exists() else 'no such folder'}")
    try:
        from lt2dsl.hf import cli as hf
    except ModuleNotFoundError as e:
        raise UsageError(
            f"`import` needs the `hf` extra (pip install 'lt2dsl[hf]'): no module `{e.name}`"
        ) from None
    return hf.run(args, out, err, report)


def summary(loaded) -> str:
    """One line: name, blocks stored and applied, loops, width, heads."""
    from lt2dsl.ir import nodes as n
    from lt2dsl.passes.resolve import blocks

    m = loaded.model
    bs = blocks(m.body)
    loops, todo = 0, list(m.body)
    while todo:
        s = todo.pop()
        if isinstance(s, n.LoopBlock):
            loops += 1
            todo += s.body
    depth = sum(mult for _, mult in bs)
    kinds = sorted({mx.type for b, _ in bs for mx in b.mixers})
    c = m.config
    return (
        f"{c.name}: ok — {len(bs)} blocks ({depth} applied), {loops} loop{'s' * (loops != 1)}, "
        f"dim {c.dim}, heads {c.heads}×{c.head_dim}, mixers {', '.join(kinds) or 'none'}"
    )


def _optional(module: str, flag: str):
    """Import a part of lt2dsl that other engineers ship separately; a missing one is a usage
    error for the flag that needs it, not a crash of the whole CLI."""
    from importlib import import_module

    try:
        return import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise UsageError(f"`{flag}` is not available: `{module}` is not part of this build") from None
        raise


# ---- the parser ---------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose messages (which quote the user's arguments) show control
    characters visibly, as every other message of the CLI does."""

    def _print_message(self, message: str, file=None) -> None:
        super()._print_message(visible(message) if message else message, file)


def build_parser(for_compile: bool = False, verb: str | None = None) -> argparse.ArgumentParser:
    p = Parser(prog="lt2dsl", description="Compile looped linear-time transformer descriptions (.lt2).")
    p.add_argument("--version", action="version", version=f"lt2dsl {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sets = dict(
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a model setting (`dim=1024`, `loop.T=8`)",
    )

    c = sub.add_parser("check", help="parse and validate files; print diagnostics")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--set", **sets)
    c.set_defaults(run=cmd_check)

    f = sub.add_parser("fmt", help="rewrite files in canonical form (`-`: stdin to stdout)")
    f.add_argument("files", nargs="+", metavar="FILE")
    f.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    f.set_defaults(run=cmd_fmt)

    g = sub.add_parser("graph", help="print the model's block graph")
    g.add_argument("file", metavar="FILE")
    g.add_argument("--dot", action="store_true", help="Graphviz DOT instead of text")
    g.add_argument("--set", **sets)
    g.set_defaults(run=cmd_graph)

    e = sub.add_parser("explain", help="explain a diagnostic code (e.g. E0101)")
    e.add_argument("code", metavar="CODE")
    e.set_defaults(run=cmd_explain)

    k = sub.add_parser("compile", help="validate, then estimate (--estimate) or lower (--emit fx)")
    k.add_argument("file", metavar="FILE")
    k.add_argument("--set", **sets)
    k.add_argument("--emit", choices=["fx"], help="print the lowered torch.fx module")
    k.add_argument("--no-fuse", action="store_true", help="lower without the FX fusion passes")
    if for_compile:
        _add_estimate_flags(k)
    if "--estimate" not in k._option_string_actions:
        k.add_argument("--estimate", action="store_true", help="print the cost report")
    k.set_defaults(run=cmd_compile)

    i = sub.add_parser("import", help="a local Hugging Face checkpoint folder → .lt2 (+ weights)")
    i.add_argument("dir", metavar="DIR", help="a checkpoint folder: config.json + safetensors (no hub)")
    i.add_argument("-o", "--output", metavar="FILE", help="write the .lt2 program here (default: stdout)")
    i.add_argument("--weights", metavar="FILE", help="write the weights under lt2dsl's names (safetensors)")
    i.set_defaults(run=cmd_import)
    _room_verb(sub, "eval", "lt2dsl.tasks.cli", "score weights on a synthetic task", verb)
    _room_verb(sub, "analyze", "lt2dsl.analysis.cli", "Toeplitz index, state rank and receptive field", verb)
    _room_verb(sub, "bench", "lt2dsl.engine.cli", "measure a compiled model against its estimate", verb)
    _room_verb(sub, "warmup", "lt2dsl.engine.warmup", "fill the autotune cache for decode shapes", verb)
    _room_verb(sub, "train", "lt2dsl.train.cli", "train a model from a TOML run file (docs/train.md)", verb)
    _room_verb(sub, "distill", "lt2dsl.distill.cli", "distil a model into a student (docs/distill.md)", verb)
    return p


def _room_verb(sub, verb: str, module: str, help: str, chosen: str | None) -> None:
    """A verb implemented in its room: the room's `add_arguments(parser)` and `run(args, out, err)`.
    The room is imported only when its verb is the `chosen` one, so other commands start without
    it; a room missing from this build makes the verb a usage error."""
    p = sub.add_parser(verb, help=help)
    if chosen != verb:
        return
    room = _optional(module, verb)
    room.add_arguments(p)
    p.set_defaults(run=room.run)


def version() -> str:
    """The installed distribution's version (`pyproject.toml`)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("lt2dsl")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _add_estimate_flags(parser: argparse.ArgumentParser) -> None:
    try:
        from lt2dsl.cost import cli as cost_cli
    except ModuleNotFoundError as e:
        if e.name and "lt2dsl.cost.cli".startswith(e.name):
            return  # the estimator is not part of this build: `--estimate` says so when used
        raise
    cost_cli.add_arguments(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: run one command, return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):
        # a terminal that cannot show `×` or `→` gets an escape, not an encoding crash
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
    out, err = consoles()
    try:
        verb = argv[0] if argv else None
        args = build_parser(for_compile=verb == "compile", verb=verb).parse_args(argv)
        return args.run(args, out, err)
    except UsageError as e:
        emit(err, f"error: {e}")
        return EXIT_USAGE
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:
        emit(err, "\n".join(internal_error(e)))
        return EXIT_ICE


@rule("E9999")
def internal_error(exc: BaseException) -> Iterator[str]:
    """Internal compiler error.

    What it checks:
        Nothing about the input: lt2dsl itself failed (a bug). The CLI reports it in one line,
        with the Python traceback only under `LT2_DEBUG=1`, and exits with code 3.

    Why it matters:
        Whatever the input, lt2dsl should answer with a diagnostic; an internal error means a
        check is missing or a pass is wrong, and is worth a bug report.

    Example:
        LT2_DEBUG=1 lt2dsl check model.lt2

    Use instead:
        Report the input and the traceback printed under `LT2_DEBUG=1`.
    """
    yield f"error[E9999]: internal compiler error: {type(exc).__name__}: {exc}"
    yield "  = note: this is a bug in lt2dsl, not in your input"
    if debug_level():
        yield "".join(traceback.format_exception(exc)).rstrip()
    else:
        yield "  = note: run with `LT2_DEBUG=1` for the traceback"


if __name__ == "__main__":
    raise SystemExit(main())
