"""`lt2dsl bench decode`: the `bench` verb of `lt2dsl/cli.py`, and the flags and helpers the
engine's verbs share (`warmup.py` is the other).

`bench decode FILE... --ctx 4k,8k --batch 1,8 [--hw h100|h200] [--json OUT] [--plot OUT.png]`
measures decode tokens/s against context next to the estimate for the same card (`bench.py`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lt2dsl.cli import EXIT_ERRORS, EXIT_OK, UsageError, existing, overrides_of, report
from lt2dsl.cost.cli import UsageError as SizeError
from lt2dsl.cost.cli import parse_lengths
from lt2dsl.cost.hardware import load_hardware
from lt2dsl.dtypes import torch_dtype
from lt2dsl.engine import bench
from lt2dsl.engine.report import plot, summary_table, table

# device-name fragment -> hardware preset of the estimate
CARDS = {"H200": "h200", "H100": "h100", "A100": "a100", "B200": "b200"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`bench`'s arguments: the `decode` bench (the one bench so far) and its flags."""
    which = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    d = which.add_parser("decode", help="decode tokens/s against context, next to the estimate")
    model_arguments(d, ctx="4k,8k,32k", batch="1,8")
    d.add_argument("--hw", default=None, help="hardware preset of the estimate [the device's card]")
    d.add_argument("--json", default=None, metavar="OUT", help="write the points as JSON")
    d.add_argument("--plot", default=None, metavar="OUT.png", help="write tok/s against context as a PNG")
    d.add_argument("--steps", type=int, default=32, help="timed decode steps per point [32]")
    d.add_argument("--warm", type=int, default=4, help="untimed decode steps before them [4]")
    d.add_argument("--warmup", action="store_true", help="fill the autotune cache first (`lt2dsl warmup`)")


def run(args, out, err) -> int:
    return bench_decode(args, out, err)


def model_arguments(p: argparse.ArgumentParser, ctx: str, batch: str) -> None:
    """The flags of the engine's verbs: the files, the shapes, where and how to run them."""
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--ctx", default=ctx, help=f"prompt lengths: 4k,8k or 1k..32k [{ctx}]")
    p.add_argument("--batch", default=batch, help=f"batch sizes [{batch}]")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="[cuda if present]")
    p.add_argument(
        "--dtype", choices=("bf16", "fp16", "fp32"), default=None, help="[bf16 on CUDA, fp32 on CPU]"
    )
    p.add_argument("--no-fuse", action="store_true", help="run the unfused graph")
    p.add_argument(
        "--rules",
        default="default",
        metavar="SETS",
        help="fusion rule sets, each model runs once per set: `default` or `+RULE[+RULE]` with opt-in "
        "rules, e.g. default,+decode_gemv [default]",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a model setting")


def bench_decode(args, out, err) -> int:
    if args.steps < 1 or args.warm < 0:
        raise UsageError("--steps must be >= 1 and --warm >= 0")
    device = pick_device(args)
    models = load_models(args, err, device)
    if models is None:
        return EXIT_ERRORS
    plan = bench.Plan(
        sizes(args.ctx, "--ctx"), sizes(args.batch, "--batch"), args.steps, args.warm, _hw(args, device)
    )
    if args.warmup:
        with progress_bar(err, "warm-up", models, plan.batches, plan.contexts) as advance:
            bench.warm(models, plan.batches, plan.contexts, advance)
    info = bench.meta(device, plan, model_dtype(args, device))

    def measured(rows: list[dict]) -> None:
        """After each point: the JSON so far (a run cut short keeps it), and a line on a log (a
        progress bar shows nothing on a file or a pipe)."""
        if args.json:
            bench.write_json(args.json, info, rows)
        if not err.is_terminal:
            err.print(point_line(rows[-1]), markup=False, highlight=False, soft_wrap=True)

    with progress_bar(err, "decode", models, plan.batches, plan.contexts) as advance:
        rows = bench.run(models, plan, advance, measured)
    summarized = bench.summary(rows)
    if args.json:
        bench.write_json(args.json, info, rows, summarized)
    wide(out).print(table(rows, info))
    wide(out).print(summary_table(summarized))
    if args.plot:
        plot(args.plot, rows, info)
    return EXIT_OK


def point_line(row: dict) -> str:
    """One measured point as a line: `model B=1 L=4096: 97.8 tok/s (estimate 254), step 10.22 ms`."""
    head = f"{row['model']} B={row['batch']} L={row['ctx']}:"
    if row.get("oom"):
        return f"{head} {'skipped after an out-of-memory point' if row.get('skipped') else 'out of memory'}"
    return (
        f"{head} {row['tok_s']:.1f} tok/s (estimate {row['estimate_tok_s']:.0f}), "
        f"step {row['step_ms']:.2f} ms, prefill {row['prefill_s']:.2f} s"
    )


def wide(out: Console) -> Console:
    """The output console, at least 150 columns wide when it is not a terminal (a file or a pipe
    gets whole rows rather than the 80-column default)."""
    if out.is_terminal:
        return out
    return Console(file=out.file, width=max(out.width, 150), highlight=False, emoji=False, markup=False)


@contextmanager
def progress_bar(err, what: str, models, batches, contexts) -> Iterator:
    """A rich progress bar over every (model, batch, context) point; yields `advance(description)`."""
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, console=err, transient=True) as progress:
        task = progress.add_task(what, total=len(models) * len(batches) * len(contexts))
        yield lambda description: progress.update(task, advance=1, description=description)


def sizes(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(parse_lengths(text, "batch size" if flag == "--batch" else "length"))
    except SizeError as e:
        raise UsageError(f"{flag}: {e}") from None


def pick_device(args) -> torch.device:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    if args.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(args.device)


def _hw(args, device: torch.device):
    name = args.hw
    if name is None:
        card = bench.device_name(device)
        name = next((v for k, v in CARDS.items() if k in card), "cpu" if device.type == "cpu" else None)
        if name is None:
            raise UsageError(f"no estimate preset for `{card}`: pass --hw (h100, h200, ... or a JSON file)")
    try:
        return load_hardware(name)
    except ValueError as e:
        raise UsageError(str(e)) from None


def load_models(args, err, device: torch.device):
    """(name, builder of the model in eval mode) per file and rule set, or None after reporting a
    file's errors: every file is parsed and checked first, each model is built (its weights on
    `device`) only when `bench.run` or `bench.warm` reaches it."""
    import functools

    from lt2dsl.frontend import load

    dtype = model_dtype(args, device)
    out, overrides, sets = [], overrides_of(args), rule_sets(args.rules, not args.no_fuse)
    for f in args.files:
        loaded = load(existing(f), overrides)
        report(err, loaded.diagnostics, loaded.sources)
        if loaded.model is None:
            return None
        for opt_in in sets:
            kw = {"device": device, "dtype": dtype, "fuse": not args.no_fuse, "opt_in": opt_in}
            name = loaded.model.config.name + "".join(f"+{r}" for r in opt_in)
            out.append((name, functools.partial(_build, loaded.model, kw)))
    return out


def _build(ir, kw: dict):
    from lt2dsl.lowering import compile_model

    return compile_model(ir, **kw).eval()


def model_dtype(args, device: torch.device) -> torch.dtype:
    """--dtype, else bf16 on CUDA and fp32 on the CPU."""
    return torch_dtype(args.dtype or ("bf16" if device.type == "cuda" else "fp32"))


def rule_sets(text: str, fuse: bool) -> list[tuple[str, ...]]:
    """`--rules`: one tuple of opt-in fusion rules per comma-separated set (`default`: none)."""
    from lt2dsl.lowering.fx_passes import opt_in_names

    sets = []
    for item in (t.strip() for t in text.split(",")):
        if item == "default":
            sets.append(())
            continue
        names = [n for n in item.split("+") if n]
        if not item.startswith("+") or not names:
            raise UsageError(f"--rules: `{item}` is neither `default` nor `+RULE[+RULE]`")
        try:
            sets.append(opt_in_names(names))
        except ValueError as e:
            raise UsageError(f"--rules: {e}") from None
    if not fuse and any(sets):
        raise UsageError("--rules: opt-in fusion rules need the fusion pass (drop --no-fuse)")
    return sets
