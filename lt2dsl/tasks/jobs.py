"""The experiment runner's bookkeeping: which (run, seed) pairs are still to train, and training
them in parallel child processes under a CPU-thread share and a wall-clock deadline.

A child is this package's experiment module run for one (run, seed) (`--runs R --seeds S
--no-report`), logging to `<out>/logs/<run>--seed<k>.log`. Each child gets `threads` intra-op
CPU threads (`--threads`; the parent passes `max(1, cores // jobs)`), so `jobs` children share
the host's cores instead of each starting one thread per core. At the deadline the parent stops
the children still training; their pairs have no result file and the summary lists them as
missing (a later call with the same command trains them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lt2dsl.tasks.experiment_config import DataEntry, RunConfig

# seconds a child gets to exit after SIGTERM before it is killed
GRACE_S = 5.0


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def result_name(run: RunConfig, data: DataEntry, seed: int) -> str:
    return f"{slug(run.name)}--{slug(data.name)}--seed{seed}.json"


def pending(
    data: list[DataEntry], runs: list[RunConfig], seeds: list[int], out: Path, force: bool
) -> list[tuple[RunConfig, int]]:
    """The (run, seed) pairs with the result file of some entry of `data` missing (all of them
    with `force`)."""
    return [
        (run, seed)
        for run in runs
        for seed in seeds
        if force or any(not (out / "runs" / result_name(run, d, seed)).exists() for d in data)
    ]


def host_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def child_threads(jobs: int, cores: int | None = None) -> int:
    """Intra-op threads of each of `jobs` children sharing `cores` (default: this host's)."""
    return max(1, (cores or host_cores()) // jobs)


def child_command(args: argparse.Namespace, out: Path, threads: int) -> list[str]:
    """The experiment module's command line for one child, less its `--runs` and `--seeds`."""
    cmd = [sys.executable, "-m", "lt2dsl.tasks.experiment", args.config, "--out", str(out)]
    flags = (
        ("--device", args.device),
        ("--steps", args.steps),
        ("--backend", args.backend),
        ("--data", args.data),
    )
    for flag, value in flags:
        if value is not None:
            cmd += [flag, str(value)]
    if args.cuda_graph is not None:
        cmd.append("--cuda-graph" if args.cuda_graph else "--no-cuda-graph")
    cmd += ["--threads", str(threads), "--no-report"]
    return cmd + (["--force"] if args.force else [])


@dataclass
class Outcome:
    """What `run_parallel` saw: the failed children (as lines naming their logs) and the pairs
    stopped at the deadline or never started before it."""

    failed: list[str] = field(default_factory=list)
    cut: list[tuple[str, int]] = field(default_factory=list)


def run_parallel(
    args: argparse.Namespace, units: list[tuple[RunConfig, int]], out: Path, progress, deadline: float | None
) -> Outcome:
    """Each (run, seed) of `units` in a child process, at most `args.jobs` at once, each with
    `max(1, cores // jobs)` threads; `deadline` (a `time.monotonic()` value, or None) stops the
    children still running then and starts no more."""
    base = child_command(args, out, child_threads(args.jobs))
    (out / "logs").mkdir(parents=True, exist_ok=True)
    bar = progress.add_task(f"{len(units)} trainings, {args.jobs} at once", total=len(units), info="")
    waiting, running, outcome = list(units), [], Outcome()
    try:
        while waiting or running:
            if deadline is not None and time.monotonic() >= deadline:
                outcome.cut += [(name, s) for _, name, s, _ in running] + [(r.name, s) for r, s in waiting]
                break
            while waiting and len(running) < args.jobs:
                running.append(_start(base, out, *waiting.pop(0)))
            time.sleep(0.2)
            for item in [r for r in running if r[0].poll() is not None]:
                proc, name, seed, log = item
                running.remove(item)
                if proc.returncode != 0:
                    outcome.failed.append(f"{name} seed {seed} exited with {proc.returncode}; see {log}")
                info = f"{len(outcome.failed)} failed" if outcome.failed else ""
                progress.update(bar, advance=1, info=info)
    finally:  # the deadline, or the parent interrupted: no child outlives it
        stop([proc for proc, *_ in running])
    return outcome


def _start(base: list[str], out: Path, run: RunConfig, seed: int) -> tuple[subprocess.Popen, str, int, Path]:
    """One child in its own process group (so `stop` reaches the processes it starts too)."""
    log = out / "logs" / f"{slug(run.name)}--seed{seed}.log"
    with log.open("w") as f:
        cmd = [*base, "--runs", run.name, "--seeds", str(seed)]
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, run.name, seed, log


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each child's process group, then SIGKILL what is left after `GRACE_S` seconds.
    A child writes its result file atomically, so a stopped child leaves none."""
    procs = [p for p in procs if p.poll() is None]
    for p in procs:
        _signal(p, signal.SIGTERM)
    end = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(p, signal.SIGKILL)
            p.wait()


def _signal(p: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited meanwhile
        os.killpg(p.pid, sig)
