"""`lt2dsl distill CONFIG.toml`: the verb's arguments and its run (`lt2dsl.cli` calls these).

The command line stays small and fixed, as `lt2dsl train`'s: everything else is a field of the
run file. `OPTIONS` is that list; a test pins it.

    lt2dsl distill gdn.toml
    lt2dsl distill gdn.toml --resume          # skip finished stages, continue the unfinished one
"""

from __future__ import annotations

import argparse
from pathlib import Path

OPTIONS = ("--resume", "--out", "--seed", "--device")
EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", metavar="CONFIG", help="the run file (TOML)")
    p.add_argument("--resume", action="store_true", help="continue the run in its folder")
    p.add_argument("--out", help="override `training.out`")
    p.add_argument("--seed", type=int, help="override `training.seed`")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override `training.device`")


def overrides(args: argparse.Namespace) -> dict:
    out = {
        f"training.{a}": getattr(args, a) for a in ("out", "seed", "device") if getattr(args, a) is not None
    }
    if "training.out" in out:  # a path on the command line is relative to the working folder
        out["training.out"] = str(Path(out["training.out"]).resolve())
    return out


def run(args: argparse.Namespace, out, err) -> int:
    """Load the run file and distil; a bad config, data or student is `error: ...` (a student that
    does not line up: a diagnostic at its source) and exit code 1; a missing run file: 2."""
    from lt2dsl.distill.config import load_config
    from lt2dsl.distill.lineup import Mismatch
    from lt2dsl.distill.pipeline import run as distill

    if not Path(args.config).is_file():
        err.file.write(f"error: cannot read `{args.config}`: no such file\n")
        return EXIT_USAGE
    try:
        distill(load_config(args.config, overrides(args)), resume=args.resume)
    except Mismatch as m:
        _report(err, m)
        return EXIT_ERRORS
    except (ValueError, TypeError) as e:
        err.file.write(f"error: {e}\n")
        return EXIT_ERRORS
    return EXIT_OK


def _report(err, m) -> None:
    from lt2dsl.cli import report
    from lt2dsl.source import SourceFile

    files = {s.file for s in (m.span, m.teacher) if s.known and s.file and Path(s.file).is_file()}
    sources = {f: SourceFile(name=f, text=Path(f).read_text(encoding="utf-8")) for f in files}
    report(err, [m.diagnostic()], sources)
