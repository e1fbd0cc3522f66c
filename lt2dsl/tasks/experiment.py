"""Run one claim's experiment: `python -m lt2dsl.tasks.experiment examples/experiments/c_copy.toml`.

Every (run, data entry, seed) trains a fresh model with the trainer (`lt2dsl.train.run`, in a
temporary run folder, no checkpoints; a curriculum ends the training once solved), is evaluated
on the test split, and lands in `<out>/runs/<run>--<data>--seed<k>.json` (written atomically).
A training whose file exists is skipped, so an experiment can be run in pieces (`--runs`,
`--seeds`) across several calls and resumed after an interruption; `--report-only` rebuilds the
summary (`results.json`, `results.md`, `results.png`) from the files present.

Options: `--device` (default cuda when available), `--steps` (override every training's steps,
for a smoke run), `--backend` (override the kernel backend), `--out` (default
`docs/results/<name>`), `--force` (train again), `--jobs N` (train N (run, seed) pairs at once,
each in its own process logging to `<out>/logs/`: the small models of these experiments leave
one GPU mostly idle, so their wall time is bound by the host and divides by N up to its cores).
"""

from __future__ import annotations

import argparse
import re
import subprocess
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
    load_experiment,
    train_config,
)
from lt2dsl.tasks.report import summarize, summary_table, write_json, write_summary


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


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
    exp: ExperimentConfig, run: RunConfig, data: DataEntry, seed: int, root: Path, device: str, progress
) -> dict[str, Any]:
    """Train, evaluate and describe one (run, data entry, seed)."""
    from lt2dsl.train import run as train

    t0 = time.perf_counter()
    tc = exp.training
    check_model_fits(lt2dsl.compile(root / run.model, device="meta", **run.overrides), data.task())
    bar = progress.add_task(f"{run.name} · {data.name} · seed {seed}", total=tc.steps, info="")

    def on_step(step: int, result) -> bool:
        row = result.rows[-1] if result.rows else {}
        info = f"loss {row['loss']:.3f}" if "loss" in row else ""
        if "task/accuracy" in row:
            info += f" acc {row['task/accuracy']:.3f}"
        if "task/stage" in row:
            info += f" stage {row['task/stage']}"
        progress.update(bar, completed=step, info=info)
        curriculum = getattr(result.task, "curriculum", None)
        return curriculum is not None and curriculum.solved

    with tempfile.TemporaryDirectory(prefix="lt2-experiment-") as work:
        kind = "cuda" if device.startswith("cuda") else "cpu"
        cfg = train_config(exp, run, data, seed, root, kind, Path(work))
        result = train(cfg, on_step=on_step)
    progress.update(bar, completed=tc.steps)
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
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, help="override the training steps (smoke runs)")
    p.add_argument("--backend", choices=["auto", "reference", "triton"], help="override the kernel backend")
    p.add_argument("--out", help="results folder (default docs/results/<name>)")
    p.add_argument("--force", action="store_true", help="train again where a result file exists")
    p.add_argument("--report-only", action="store_true", help="only rebuild the summary")
    p.add_argument("--jobs", type=int, default=1, help="(run, seed) pairs trained at once [1]")
    p.add_argument("--no-report", action="store_true", help="train only; leave the summary to the caller")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be at least 1, got {args.jobs}")
    return args


def select(exp: ExperimentConfig, args: argparse.Namespace) -> tuple[list[RunConfig], list[int]]:
    runs = exp.runs
    if args.runs:
        wanted = [s.strip() for s in args.runs.split(",")]
        unknown = sorted(set(wanted) - {r.name for r in runs})
        if unknown:
            raise ValueError(f"unknown runs {unknown}; the file has {[r.name for r in runs]}")
        runs = [r for r in runs if r.name in wanted]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else exp.seeds
    return runs, seeds


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(stderr=True)
    failed: list[str] = []
    try:
        exp, root = load_experiment(args.config)
        changes = {"steps": args.steps, "backend": args.backend}
        changes = {k: v for k, v in changes.items() if v is not None}
        exp = exp.model_copy(update={"training": exp.training.model_copy(update=changes)})
        runs, seeds = select(exp, args)
        out = Path(args.out or f"docs/results/{exp.name}")
        if not args.report_only:
            check_equal_params(exp, root)
            columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"))
            with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
                if args.jobs > 1:
                    failed = run_parallel(args, pending(exp, runs, seeds, out, args.force), out, progress)
                else:
                    for run in runs:
                        for data in exp.data:
                            for seed in seeds:
                                path = out / "runs" / result_name(run, data, seed)
                                if path.exists() and not args.force:
                                    continue
                                write_json(path, run_one(exp, run, data, seed, root, args.device, progress))
    except (ValueError, DiagnosticError) as e:
        console.print(f"error: {e}", markup=False, highlight=False)
        return 1
    for line in failed:
        console.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
    if args.no_report:
        return 1 if failed else 0
    results = [_read(p) for p in sorted((out / "runs").glob("*.json"))]
    summary = summarize(exp, [r for r in results if r is not None])
    command = f"python -m lt2dsl.tasks.experiment {args.config}"
    paths = write_summary(exp, summary, out, command)
    Console().print(summary_table(exp, summary))
    for c in summary["checks"]:
        console.print(f"{c['verdict']:>9}: {c['says']} ({c['detail']})", markup=False, highlight=False)
    console.print("wrote " + ", ".join(map(str, paths)), markup=False, highlight=False)
    return 1 if failed else 0


def result_name(run: RunConfig, data: DataEntry, seed: int) -> str:
    return f"{slug(run.name)}--{slug(data.name)}--seed{seed}.json"


def pending(
    exp: ExperimentConfig, runs: list[RunConfig], seeds: list[int], out: Path, force: bool
) -> list[tuple[RunConfig, int]]:
    """The (run, seed) pairs with a result file of some data entry missing (all of them with `force`)."""
    return [
        (run, seed)
        for run in runs
        for seed in seeds
        if force or any(not (out / "runs" / result_name(run, d, seed)).exists() for d in exp.data)
    ]


def child_command(args: argparse.Namespace, out: Path) -> list[str]:
    """This module's command line for one child of `run_parallel`, less `--runs` and `--seeds`."""
    cmd = [sys.executable, "-m", "lt2dsl.tasks.experiment", args.config, "--out", str(out)]
    for flag, value in (("--device", args.device), ("--steps", args.steps), ("--backend", args.backend)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd + ["--no-report"] + (["--force"] if args.force else [])


def run_parallel(
    args: argparse.Namespace, units: list[tuple[RunConfig, int]], out: Path, progress
) -> list[str]:
    """Each (run, seed) of `units` in a child process of this module (`--runs R --seeds S
    --no-report`), at most `args.jobs` at once, its output in `<out>/logs/`; the failures as lines."""
    base = child_command(args, out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    bar = progress.add_task(f"{len(units)} trainings, {args.jobs} at once", total=len(units), info="")
    waiting, running, failed = list(units), [], []
    while waiting or running:
        while waiting and len(running) < args.jobs:
            run, seed = waiting.pop(0)
            log = out / "logs" / f"{slug(run.name)}--seed{seed}.log"
            with log.open("w") as f:
                cmd = [*base, "--runs", run.name, "--seeds", str(seed)]
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
            running.append((proc, run.name, seed, log))
        time.sleep(0.2)
        for item in [r for r in running if r[0].poll() is not None]:
            proc, name, seed, log = item
            running.remove(item)
            if proc.returncode != 0:
                failed.append(f"{name} seed {seed} exited with {proc.returncode}; see {log}")
            progress.update(bar, advance=1, info=f"{len(failed)} failed" if failed else "")
    return failed


def _read(path: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


if __name__ == "__main__":
    sys.exit(main())
