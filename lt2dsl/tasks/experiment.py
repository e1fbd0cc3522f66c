"""Run one claim's experiment: `python -m lt2dsl.tasks.experiment examples/experiments/c_copy.toml`.

Every (run, data entry, seed) trains a fresh model with the trainer (`lt2dsl.train.run`, in a
temporary run folder, no checkpoints; a training ends early once its task source is `solved`: a
curriculum's last stage, or a task's `threshold` reached), is evaluated on the test split, and
lands in `<out>/runs/<run>--<data>--seed<k>.json` (written atomically). A training whose file
exists is skipped, so an experiment can be run in pieces (`--runs`, `--seeds`) across several
calls and resumed after an interruption; `--report-only` rebuilds the summary (`results.json`,
`results.md`, `results.png`, with the trainings still missing) from the files present.

Options: `--device` (default cuda when available), `--steps` (override every training's steps,
for a smoke run), `--backend` (override the kernel backend), `--out` (default
`docs/results/<name>`), `--force` (train again), `--jobs N` (train N (run, seed) pairs at once,
each in its own process logging to `<out>/logs/` with `max(1, cores // N)` CPU threads: the
small models of these experiments leave one GPU mostly idle, so their wall time is bound by the
host and divides by N up to its cores), `--threads` (this process's intra-op CPU threads),
`--deadline S` (stop the trainings still running S seconds after the start, and report; a later
call trains them), `--archive PATH` (also pack the results folder into one `.tar.gz`),
`--cuda-graph` / `--no-cuda-graph` (override `[training] cuda_graph`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

import lt2dsl
from lt2dsl.diagnostics import DiagnosticError
from lt2dsl.tasks import evaluate
from lt2dsl.tasks.eval import check_model_fits
from lt2dsl.tasks.experiment_config import (
    DataEntry,
    ExperimentConfig,
    RunConfig,
    budget,
    load_experiment,
    train_config,
)
from lt2dsl.tasks.jobs import Outcome, pending, result_name, run_parallel
from lt2dsl.tasks.report import summarize, summary_table, write_archive, write_json, write_summary


class DeadlineReached(Exception):
    """The experiment's wall-clock deadline passed during a training (which leaves no result)."""


def count_params(root: Path, run: RunConfig) -> int:
    """Parameters of a run's model (built on the meta device: no memory, no init)."""
    model = lt2dsl.compile(root / run.model, device="meta", **run.overrides)
    return sum(p.numel() for p in model.parameters())


def check_equal_params(exp: ExperimentConfig, root: Path) -> dict[str, int]:
    """Each run's parameter count; ValueError when they spread more than `equal_params` allows."""
    counts = {r.name: count_params(root, r) for r in exp.runs}
    lo, hi = min(counts.values()), max(counts.values())
    if exp.equal_params is not None and (hi - lo) / hi > exp.equal_params:
        listing = ", ".join(f"{k}: {v:,}" for k, v in counts.items())
        raise ValueError(
            f"{exp.name}: parameter counts spread {(hi - lo) / hi:.1%}, more than equal_params = "
            f"{exp.equal_params:.0%} ({listing})"
        )
    return counts


def training_flops(exp: ExperimentConfig, root: Path, run: RunConfig, data: list[DataEntry]) -> float:
    """The estimated FLOPs of training `run` on `data` for their full steps (`lt2dsl.cost`): how
    the parallel runner orders the trainings, longest first, so the slow ones do not start last."""
    from lt2dsl.cost.estimate import EstimateOptions, estimate

    ir = lt2dsl.compile(root / run.model, device="meta", **run.overrides).ir
    total = 0.0
    for d in data:
        steps, rows = budget(exp, d)
        seq = d.task().seq_len
        total += estimate(ir, EstimateOptions(seq=seq)).flops_per_token.train * steps * rows * seq
    return total


def metrics_of(source, data: DataEntry, reports: dict[str, Any]) -> dict[str, float]:
    """`<prefix>/accuracy` per evaluation (and per variant), the curriculum's stage and solved:
    the names `DataEntry.metric_names` lists."""
    out: dict[str, float] = {}
    for prefix, rep in reports.items():
        out[f"{prefix}/accuracy"] = rep.accuracy
        if len(rep.variants) > 1:
            for name, v in rep.variants.items():
                out[f"{prefix}/{name}/accuracy"] = v.overall.accuracy
    cur = source.curriculum
    if cur is not None:
        out[f"{data.name}/stage"] = cur.stage
        out[f"{data.name}/solved"] = cur.highest_solved
    return out


def run_one(
    exp: ExperimentConfig,
    run: RunConfig,
    data: DataEntry,
    seed: int,
    root: Path,
    device: str,
    progress,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Train, evaluate and describe one (run, data entry, seed).

    Raises:
        DeadlineReached: `time.monotonic()` passed `deadline` during the training.
    """
    from lt2dsl.train import run as train

    t0 = time.perf_counter()
    tc = exp.training
    meta = lt2dsl.compile(root / run.model, device="meta", **run.overrides)
    check_model_fits(meta, data.task())
    graphed = tc.cuda_graph
    steps = budget(exp, data)[0]
    bar = progress.add_task(f"{run.name} · {data.name} · seed {seed}", total=steps, info="")

    def on_step(step: int, result) -> bool:
        row = result.rows[-1] if result.rows else {}
        info = f"loss {row['loss']:.3f}" if "loss" in row else ""
        if "task/accuracy" in row:
            info += f" acc {row['task/accuracy']:.3f}"
        if "task/stage" in row:
            info += f" stage {row['task/stage']}"
        progress.update(bar, completed=step, info=info)
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineReached(f"{run.name} · {data.name} · seed {seed} stopped at step {step}")
        return result.task.solved

    with tempfile.TemporaryDirectory(prefix="lt2-experiment-") as work:
        kind = "cuda" if device.startswith("cuda") else "cpu"
        cfg = train_config(exp, run, data, seed, root, kind, Path(work), cuda_graph=graphed)
        result = train(cfg, on_step=on_step)
    progress.update(bar, completed=steps)
    model, source = result.model, result.task
    reports = {
        prefix: evaluate(model, task, batches=tc.eval_batches, batch_size=tc.eval_batch_size, seed=seed)
        for prefix, task in data.eval_tasks().items()
    }
    return {
        "run": run.name,
        "data": data.name,
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "config": cfg.model_dump(mode="json", exclude={"training": {"out"}}),
        "metrics": metrics_of(source, data, reports),
        "curriculum": source.state_dict().get("curriculum"),
        "steps": max(result.losses, default=0),
        "solved": source.solved,
        "history": [r for r in result.rows if "loss" in r],
        "eval": {k: r.to_json() for k, r in reports.items()},
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        "seconds": time.perf_counter() - t0,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lt2dsl.tasks.experiment", description=__doc__.split("\n")[0])
    p.add_argument("config", help="the experiment's TOML file")
    p.add_argument("--runs", help="comma-separated run names (default: all)")
    p.add_argument("--seeds", help="comma-separated seeds (default: the file's)")
    p.add_argument("--data", help="comma-separated data entry names (default: all)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, help="override the training steps (smoke runs)")
    p.add_argument("--backend", choices=["auto", "reference", "triton"], help="override the kernel backend")
    p.add_argument(
        "--cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="override `[training] cuda_graph` (whole-step CUDA graphs)",
    )
    p.add_argument("--out", help="results folder (default docs/results/<name>)")
    p.add_argument("--force", action="store_true", help="train again where a result file exists")
    p.add_argument("--report-only", action="store_true", help="only rebuild the summary")
    p.add_argument("--jobs", type=int, default=1, help="(run, seed) pairs trained at once [1]")
    p.add_argument("--threads", type=int, help="intra-op CPU threads of this process [torch's default]")
    p.add_argument("--deadline", type=float, help="seconds after which running trainings stop [none]")
    p.add_argument("--archive", help="also write the results folder as this .tar.gz")
    p.add_argument("--no-report", action="store_true", help="train only; leave the summary to the caller")
    args = p.parse_args(argv)
    for flag, value in (("--jobs", args.jobs), ("--threads", args.threads)):
        if value is not None and value < 1:
            p.error(f"{flag} must be at least 1, got {value}")
    if args.deadline is not None and not args.deadline > 0:
        p.error(f"--deadline must be a positive number of seconds, got {args.deadline}")
    return args


def select(
    exp: ExperimentConfig, args: argparse.Namespace
) -> tuple[list[RunConfig], list[DataEntry], list[int]]:
    """The runs, data entries and seeds that `--runs`, `--data` and `--seeds` name (default: all)."""
    runs, data = exp.runs, exp.data
    if args.runs:
        runs = _named(runs, args.runs, "runs")
    if args.data:
        data = _named(data, args.data, "data entries")
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else exp.seeds
    return runs, data, seeds


def _named(items: list, names: str, what: str) -> list:
    wanted = [s.strip() for s in names.split(",")]
    unknown = sorted(set(wanted) - {x.name for x in items})
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; the file has {[x.name for x in items]}")
    return [x for x in items if x.name in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    deadline = None if args.deadline is None else time.monotonic() + args.deadline
    console = Console(stderr=True)
    outcome = Outcome()
    try:
        exp, root = load_experiment(args.config)
        exp = overridden(exp, args)
        runs, data, seeds = select(exp, args)
        out = Path(args.out or f"docs/results/{exp.name}")
        if not args.report_only:
            check_equal_params(exp, root)
            units = pending(data, runs, seeds, out, args.force)
            flops = {r.name: training_flops(exp, root, r, data) for r in runs}
            units.sort(key=lambda u: -flops[u[0].name])  # stable: the file's order among equals
            columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"))
            with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
                if args.jobs > 1:
                    outcome = run_parallel(args, units, out, progress, deadline)
                else:
                    outcome = train_in_turn(exp, units, root, args, out, progress, deadline)
    except (ValueError, DiagnosticError) as e:
        console.print(f"error: {e}", markup=False, highlight=False)
        return 1
    for line in outcome.failed:
        console.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
    if outcome.cut:
        cut = ", ".join(f"{name} seed {seed}" for name, seed in outcome.cut)
        console.print(f"stopped at the deadline: {cut}", markup=False, highlight=False, soft_wrap=True)
    if not args.no_report:
        report(exp, out, args, console)
    return 1 if outcome.failed else 0


def overridden(exp: ExperimentConfig, args: argparse.Namespace) -> ExperimentConfig:
    """`exp` with `--steps` (every training's, the data entries' own too), `--backend` and
    `--cuda-graph`."""
    given = (("steps", args.steps), ("backend", args.backend), ("cuda_graph", args.cuda_graph))
    changes = {k: v for k, v in given if v is not None}
    exp = exp.model_copy(update={"training": exp.training.model_copy(update=changes)})
    if args.steps is not None:
        exp = exp.model_copy(update={"data": [d.model_copy(update={"steps": None}) for d in exp.data]})
    return exp


def train_in_turn(
    exp: ExperimentConfig,
    units: list[tuple[RunConfig, int]],
    root: Path,
    args: argparse.Namespace,
    out: Path,
    progress,
    deadline: float | None,
) -> Outcome:
    """Train the data entries of each (run, seed) of `units` in this process, one at a time."""
    outcome, entries = Outcome(), select(exp, args)[1]
    for i, (run, seed) in enumerate(units):
        try:
            for data in entries:
                path = out / "runs" / result_name(run, data, seed)
                if args.force or not path.exists():
                    result = run_one(exp, run, data, seed, root, args.device, progress, deadline)
                    write_json(path, result)
        except DeadlineReached:
            outcome.cut += [(r.name, s) for r, s in units[i:]]
            break
    return outcome


def report(exp: ExperimentConfig, out: Path, args: argparse.Namespace, console: Console) -> None:
    """Summarize the result files in `out` (the table on stdout, the checks and what is missing on
    stderr), write `results.*` and, with `--archive`, the folder as one `.tar.gz`."""
    results = [_read(p) for p in sorted((out / "runs").glob("*.json"))]
    summary = summarize(exp, [r for r in results if r is not None])
    command = f"python -m lt2dsl.tasks.experiment {args.config}"
    paths = write_summary(exp, summary, out, command)
    Console().print(summary_table(exp, summary))
    for c in summary["checks"]:
        console.print(f"{c['verdict']:>12}: {c['says']} ({c['detail']})", markup=False, highlight=False)
    if summary["missing"]:
        gaps = ", ".join(f"{m['run']} · {m['data']} · seed {m['seed']}" for m in summary["missing"])
        total = len(exp.runs) * len(exp.data) * len(exp.seeds)
        line = f"missing {len(summary['missing'])} of {total} trainings: {gaps}"
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if args.archive:
        paths.append(write_archive(out, Path(args.archive)))
    console.print("wrote " + ", ".join(map(str, paths)), markup=False, highlight=False)


def _read(path: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


if __name__ == "__main__":
    sys.exit(main())
