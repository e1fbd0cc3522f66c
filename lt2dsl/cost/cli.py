"""`lt2dsl compile FILE --estimate`: the estimate's command-line flags and runner."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from lt2dsl.cost import render
from lt2dsl.cost.estimate import EstimateOptions, estimate
from lt2dsl.cost.hardware import load_hardware, presets
from lt2dsl.dtypes import ESTIMATE_DTYPES, Dtypes


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("estimate")
    g.add_argument("--estimate", action="store_true", help="print the static cost report")
    g.add_argument(
        "--seq",
        default=None,
        metavar="L",
        help="prompt / training length; lists and doubling ranges: 4k,8k,32k or 1k..32k "
        "[the model's max_len]",
    )
    g.add_argument("--batch", type=int, default=1, metavar="B", help="batch size [1]")
    g.add_argument("--gen", type=int, default=0, metavar="G", help="tokens to decode [0]")
    g.add_argument("--mode", choices=("train", "prefill", "decode", "all"), default="all")
    g.add_argument("--dtype", choices=ESTIMATE_DTYPES, help="weights and activations [model dtype]")
    g.add_argument("--state-dtype", choices=ESTIMATE_DTYPES, help="recurrent states [model state_dtype]")
    g.add_argument("--kv-dtype", choices=ESTIMATE_DTYPES, help="KV caches [--dtype, else model dtype]")
    g.add_argument("--hw", default="h200", help=f"{'|'.join(presets())} or a JSON file [h200]")
    g.add_argument(
        "--vs",
        default=None,
        metavar="FILE|baseline",
        help="side by side with another .lt2 file, or `baseline` (every mixer -> full)",
    )
    g.add_argument(
        "--causal",
        choices=("exact", "full"),
        default="exact",
        help="count the causal triangle exactly, or the whole square like FlopCounterMode",
    )
    g.add_argument("--expand", action="store_true", help="one row per (iteration, block)")
    g.add_argument(
        "--exit-profile",
        default=None,
        metavar="P1,P2,...",
        help="exit probabilities per iteration of gated loops (expected decode cost)",
    )
    out = g.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true")
    out.add_argument("--md", action="store_true")


class UsageError(ValueError):
    """A bad flag value: the CLI prints it and exits with 2."""


def parse_lengths(text: str, what: str = "length") -> list[int]:
    """`4k,8k,32k` or `1k..32k` (doubling) → [4096, 8192, 32768]; `what` names the sizes in errors
    ("length", "batch size")."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if ".." in part:
            lo, hi = (parse_size(x, what) for x in part.split("..", 1))
            if lo > hi:
                raise UsageError(f"the range {part!r} runs backwards")
            x = lo
            while x <= hi:
                out.append(x)
                x *= 2
        else:
            out.append(parse_size(part, what))
    return out


def parse_size(text: str, what: str = "length") -> int:
    m = re.fullmatch(r"(\d+)([kM]?)", text.strip())
    if not m or int(m.group(1)) <= 0:
        examples = "1, 8 or 32" if what == "batch size" else "8192, 32k or 1M"
        raise UsageError(f"expected a positive {what} such as {examples}, got {text!r}")
    return int(m.group(1)) * {"": 1, "k": 1024, "M": 1024**2}[m.group(2)]


def parse_exit_profile(text: str, model) -> tuple[float, ...]:
    """`--exit-profile P1,P2,...`: the probabilities of exiting after iteration 1, 2, … of the
    model's gated loops. Each is in [0, 1], at least one is positive, and there are at most as
    many as the shortest gated loop has iterations (a token cannot exit after iteration T + 1)."""
    from lt2dsl.passes.resolve import loops

    gated = [lp for lp in loops(model.body) if lp.exit]
    if not gated:
        raise UsageError("--exit-profile needs a loop with an exit gate (`loop T=4, exit=gate < ... >`)")
    try:
        profile = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--exit-profile expects numbers like 0.1,0.3,0.6, got {text!r}") from None
    T = min(lp.T for lp in gated)
    if len(profile) > T:
        raise UsageError(
            f"--exit-profile gives {len(profile)} probabilities but the gated loop has T={T} "
            f"iterations: give at most {T}"
        )
    if not all(0.0 <= p <= 1.0 for p in profile) or not any(profile):
        raise UsageError(
            f"--exit-profile values are probabilities in [0, 1], at least one positive, got {text!r}"
        )
    return profile


def options_from(args, model) -> list[EstimateOptions]:
    cfg = model.config
    try:
        hw = load_hardware(args.hw)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.batch < 1 or args.gen < 0:
        raise UsageError("--batch must be >= 1 and --gen >= 0")
    profile = parse_exit_profile(args.exit_profile, model) if args.exit_profile else None
    dt = Dtypes(act=args.dtype, state=args.state_dtype, kv=args.kv_dtype)
    lengths = parse_lengths(args.seq) if args.seq else [cfg.max_len]
    return [
        EstimateOptions(
            seq=L,
            batch=args.batch,
            gen=args.gen,
            mode=args.mode,
            dtypes=dt,
            hw=hw,
            causal=args.causal,
            expand=args.expand,
            exit_profile=profile,
        )
        for L in lengths
    ]


def vs_model(args, loaded):
    """The model to compare against, or (None, None); errors in a --vs file are the user's."""
    if not args.vs:
        return None, None
    if args.vs == "baseline":
        from lt2dsl.passes.baseline import to_baseline

        return to_baseline(loaded.model), "baseline (all full)"
    from lt2dsl.frontend import load

    if not Path(args.vs).is_file():  # as for the input file: a usage error, exit code 2
        why = "not a file" if Path(args.vs).exists() else "no such file"
        raise UsageError(f"cannot read --vs `{args.vs}`: {why}")
    other = load(args.vs, overrides=getattr(args, "overrides", None))
    if other.model is None:
        return other, None
    return other.model, other.model.config.name


def run(loaded, args, console) -> int:
    """Print the report for `loaded.model` in the format asked for. Returns the exit code."""
    try:
        opts = options_from(args, loaded.model)
        other, other_name = vs_model(args, loaded)
    except UsageError as e:
        from lt2dsl.diagnostics import visible

        print(visible(f"error: {e}"), file=sys.stderr)
        return 2
    if other is not None and other_name is None:  # the --vs file had errors
        from lt2dsl.diagnostics import render_all

        print(render_all(other.diagnostics, other.sources), file=sys.stderr)
        return 1
    entries = [
        render.Entry(
            report=estimate(loaded.model, o),
            vs=estimate(other, o) if other is not None else None,
            vs_name=other_name,
        )
        for o in opts
    ]
    if args.json:
        console.print_json(render.to_json(entries)) if console.is_terminal else print(render.to_json(entries))
    elif args.csv:
        sys.stdout.write(render.to_csv(entries))
    elif args.md:
        sys.stdout.write(render.to_markdown(entries))
    elif console.is_terminal:
        console.print(render.rich_output(entries, args.mode))
    else:
        sys.stdout.write(render.to_text(entries, mode=args.mode))
    return 0
