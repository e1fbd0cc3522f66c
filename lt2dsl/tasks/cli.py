"""`lt2dsl eval WEIGHTS --model M.lt2 --task NAME [--data KEY=VALUE ...]`: exact-match accuracy.

The shim in `lt2dsl/cli.py` adds these flags (`add_arguments`) and calls `run`. A rich table goes
to stdout, JSON to `--json PATH` (`-`: stdout instead of the table). Exit codes follow the CLI's:
2 for bad flags (an unknown task, a bad `--data` value, a missing file), 1 when the program has
errors or the weights or the task do not fit the model. This module imports nothing heavy until
a command runs, so the CLI starts fast.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A problem with the input files: `error: ...` and exit code `code`."""

    def __init__(self, message: str, code: int = EXIT_ERRORS):
        super().__init__(message)
        self.code = code


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The flags `eval` and `analyze` share: the weights, the program, where to run, the output."""
    p.add_argument("weights", metavar="CHECKPOINT", help="model.safetensors or a folder holding it (step-N/)")
    p.add_argument("--model", required=True, metavar="FILE.lt2", help="the model's program")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a model setting")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--backend", default="auto", choices=["auto", "reference", "triton"])
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON (`-`: stdout only)")


def add_task_arguments(p: argparse.ArgumentParser, required: bool) -> None:
    names = "state_tracking, mqar, copy, selective_copy, niah"
    p.add_argument("--task", required=required, help=f"task name: {names}")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="a task setting")
    p.add_argument("--seed", type=int, default=0, help="run seed whose test stream is used")


def positive(text: str) -> int:
    """An argparse type: a positive integer (anything else is a usage error)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_task_arguments(p, required=True)
    p.add_argument("--batches", type=positive, default=8, help="test batches per variant")
    p.add_argument("--batch-size", type=positive, default=32)


def toml_value(text: str) -> Any:
    """A `--data` value in TOML syntax (`64`, `0.5`, `true`, `[1, 2]`); a bare word is a string."""
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def pairs(items: list[str], flag: str) -> dict[str, Any]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CommandError(f"`{flag}` expects KEY=VALUE, got `{item}`", EXIT_USAGE)
        out[key.strip()] = toml_value(value.strip())
    return out


def task_config(args: argparse.Namespace):
    """The task config of `--task` and `--data` (usage error when it is not one)."""
    from lt2dsl.tasks import parse_config

    try:
        return parse_config({"task": args.task, **pairs(args.data, "--data")})
    except ValueError as e:
        raise CommandError(str(e), EXIT_USAGE) from None


def model_of(args: argparse.Namespace, err):
    """The compiled model with its weights loaded (diagnostics printed to `err` on errors)."""
    import torch

    from lt2dsl.diagnostics import DiagnosticError
    from lt2dsl.tasks.checkpoint import load_model, weights_file

    if not Path(args.model).is_file():
        raise CommandError(f"cannot read `{args.model}`: no such file", EXIT_USAGE)
    try:
        weights_file(args.weights)
    except FileNotFoundError as e:
        raise CommandError(str(e), EXIT_USAGE) from None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return load_model(
            args.model, args.weights, overrides=pairs(args.set, "--set"), device=device, backend=args.backend
        )
    except DiagnosticError as e:
        err.file.write(str(e).rstrip() + "\n")
        raise CommandError(f"`{args.model}` has errors") from None
    except (ValueError, RuntimeError) as e:
        raise CommandError(str(e)) from None


def emit_json(path: str | None, obj: Any, out) -> bool:
    """Write `obj` as JSON to `path` (atomically) or stdout (`-`); True when stdout got it."""
    if path is None:
        return False
    text = json.dumps(obj, indent=2, allow_nan=True)
    if path == "-":
        out.file.write(text + "\n")
        return True
    from lt2dsl.tasks.report import atomic_write

    atomic_write(Path(path), text + "\n")
    return False


def run(args: argparse.Namespace, out, err) -> int:
    """`lt2dsl eval`: the shim's entry."""
    try:
        cfg = task_config(args)
        model = model_of(args, err)
        from lt2dsl.tasks.eval import evaluate

        try:
            report = evaluate(
                model,
                cfg,
                batches=args.batches,
                batch_size=args.batch_size,
                seed=args.seed,
                progress=err.is_terminal,
            )
        except ValueError as e:
            raise CommandError(str(e)) from None
    except CommandError as e:
        err.file.write(f"error: {e}\n")
        return e.code
    if not emit_json(args.json, report.to_json(), out):
        from rich.console import Console

        from lt2dsl.tasks.report import eval_table

        Console(file=out.file, soft_wrap=True).print(eval_table(report))
    return EXIT_OK
