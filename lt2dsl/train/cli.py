"""`lt2dsl train CONFIG.toml`: the verb's arguments and its run (`lt2dsl.cli` calls these).

The command line stays small and fixed (torchtitan freezes its CLI the same way): everything else
is a field of the run file. `OPTIONS` is that list; a test pins it.

    lt2dsl train run.toml
    lt2dsl train run.toml --resume                 # newest complete checkpoint of the run folder
    torchrun --nproc-per-node 8 -m lt2dsl train run.toml
"""

from __future__ import annotations

import argparse
from pathlib import Path

OPTIONS = ("--resume", "--steps", "--out", "--seed", "--device")
EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", metavar="CONFIG", help="the run file (TOML; YAML with PyYAML installed)")
    p.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="CHECKPOINT",
        help="continue from a checkpoint folder (default: the newest complete one of the run)",
    )
    p.add_argument("--steps", type=int, help="override `training.steps`")
    p.add_argument("--out", help="override `training.out`")
    p.add_argument("--seed", type=int, help="override `training.seed`")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override `training.device`")


def overrides(args: argparse.Namespace) -> dict:
    names = {
        "steps": "training.steps",
        "out": "training.out",
        "seed": "training.seed",
        "device": "training.device",
    }
    out = {key: getattr(args, a) for a, key in names.items() if getattr(args, a) is not None}
    if "training.out" in out:  # a path on the command line is relative to the working folder
        out["training.out"] = str(Path(out["training.out"]).resolve())
    return out


def run(args: argparse.Namespace, out, err) -> int:
    """Load the run file, train; a bad config or data is `error: ...` and exit code 1 (a missing
    run file: 2, as the other commands treat a missing input)."""
    from lt2dsl.train.config import load_config
    from lt2dsl.train.loop import run as train

    if not Path(args.config).is_file():
        err.file.write(f"error: cannot read `{args.config}`: no such file\n")
        return EXIT_USAGE
    try:
        cfg = load_config(args.config, overrides(args))
        train(cfg, resume=args.resume)
    except (ValueError, TypeError) as e:
        err.file.write(f"error: {e}\n")
        return EXIT_ERRORS
    return EXIT_OK
