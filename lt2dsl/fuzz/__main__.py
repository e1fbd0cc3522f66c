"""`python -m lt2dsl.fuzz`: the reliability campaign of docs/reliability.md.

Three phases, each job in a worker process killed after `--timeout` seconds:

1. character mutants of the examples (and random bytes) through `lt2dsl check` and
   `lt2dsl fmt --check`: exit 0 or 1, never an internal error, an escaped exception or a hang;
   an exit 1 of `check` always with an `error[E....]` diagnostic; no raw control character;
2. generated programs through `lt2dsl compile --emit fx`: whatever `check` accepts lowers;
3. the first `--run` accepted programs compiled on the reference backend in fp32: forward and
   backward finite, prefill + single-token decode equal to the forward within 1e-4 relative.

Prints a table, writes `summary.json` (every failure with its input) to `--out`, and a
histogram of the decode errors (`decode_errors.png`) where matplotlib is installed. Exit code 0
when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from lt2dsl.fuzz import mutants, programs
from lt2dsl.fuzz.pool import HANG, run_jobs
from lt2dsl.fuzz.runner import DECODE_RTOL, CliOutcome, RunOutcome

ROOT = Path(__file__).resolve().parents[2]
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
KEEP = 20  # failing inputs kept per kind of failure in summary.json


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lt2dsl.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--programs", type=int, default=5000, help="generated programs [5000]")
    p.add_argument("--mutants", type=int, default=10000, help="character mutants [10000]")
    p.add_argument("--run", type=int, default=1000, help="accepted programs run on the CPU [1000]")
    p.add_argument("--seed", type=int, default=0, help="seed of the generator and the mutations [0]")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a job is a hang [30]")
    p.add_argument("--jobs", type=int, default=1, help="worker processes [1]")
    p.add_argument("--out", type=Path, default=Path("fuzz-report"), help="folder for the report")
    return p.parse_args(argv)


def cli_failure(argv: list[str], o: CliOutcome | str) -> str | None:
    """What went wrong with one CLI run, None when it behaved."""
    if not isinstance(o, CliOutcome):
        return "hang" if o == HANG else "worker died"
    if o.escaped:
        return "exception escaped the CLI"
    if o.internal or o.status not in (0, 1):
        return f"internal error (exit {o.status})"
    if RAW_CONTROL.search(o.stderr):
        return "raw control character echoed"
    if argv[0] == "check" and (o.status == 1) != bool(re.search(r"^error\[E\d{4}\]: ", o.stderr, re.M)):
        return "exit code and diagnostics disagree"
    return None


def run_failure(o: RunOutcome | str) -> str | None:
    if not isinstance(o, RunOutcome):
        return "hang" if o == HANG else "worker died"
    if o.error:
        return "exception"
    if not o.finite:
        return "non-finite output"
    if not o.grads_finite:
        return "non-finite gradient"
    if not o.decodes_as_it_runs:
        return "decode differs from the forward"
    return None


class Phase:
    """One phase's counts and a few failing inputs per kind of failure."""

    def __init__(self, name: str):
        self.name, self.total, self.failures = name, 0, Counter()
        self.examples: dict[str, list[str]] = {}
        self.seconds = 0.0

    def add(self, failure: str | None, shown: str) -> None:
        self.total += 1
        if failure is not None:
            self.failures[failure] += 1
            self.examples.setdefault(failure, [])
            if len(self.examples[failure]) < KEEP:
                self.examples[failure].append(shown)

    def as_dict(self) -> dict:
        return {
            "jobs": self.total,
            "failures": dict(self.failures),
            "seconds": round(self.seconds, 1),
            "examples": self.examples,
        }


def run_phase(phase: Phase, jobs: list, args, progress: Progress, on_result) -> None:
    task = progress.add_task(phase.name, total=len(jobs))
    t0 = time.perf_counter()
    every = max(1, len(jobs) // 20)  # a log line per 5% where no live bar can be drawn (a file)
    for done, (index, result) in enumerate(run_jobs(jobs, args.jobs, args.timeout), 1):
        on_result(index, result)
        progress.advance(task)
        if not progress.console.is_terminal and (done % every == 0 or done == len(jobs)):
            failed = sum(phase.failures.values())
            progress.console.print(f"{phase.name}: {done:,}/{len(jobs):,}, {failed} failed, "
                                   f"{time.perf_counter() - t0:.0f} s")  # fmt: skip
    phase.seconds = time.perf_counter() - t0


def campaign(args) -> dict:
    seeds = mutants.seeds(ROOT)
    data = mutants.inputs(seeds, args.mutants, random.Random(args.seed))
    rnd = random.Random(args.seed)
    texts = [programs.generate(rnd) for _ in range(args.programs)]
    mut, gen, ran = Phase("mutants: check, fmt --check"), Phase("programs: compile --emit fx"), Phase("runs")
    accepted: list[str] = []
    errors: list[float] = []
    ill: list[dict] = []  # fp32 decode beyond 1e-4, ill-conditioned and exact in float64
    with Progress(console=Console(stderr=True)) as progress:
        jobs = [("cli", (argv, d)) for d in data for argv in (["check"], ["fmt", "--check"])]

        def on_mutant(i, o):
            argv, d = jobs[i][1]
            mut.add(cli_failure(argv, o), f"{' '.join(argv)}: {d!r}")

        run_phase(mut, jobs, args, progress, on_mutant)
        pjobs = [("cli", (["compile", "--emit", "fx"], t.encode())) for t in texts]
        status: dict[int, int | None] = {}

        def on_program(i, o):
            gen.add(cli_failure(["compile"], o), texts[i])
            status[i] = o.status if isinstance(o, CliOutcome) else None

        run_phase(gen, pjobs, args, progress, on_program)
        accepted = [texts[i] for i in sorted(status) if status[i] == 0]
        rjobs = [("run", t) for t in accepted[: args.run]]

        def on_run(i, o):
            ran.add(run_failure(o), rjobs[i][1])
            if isinstance(o, RunOutcome) and not o.error:
                errors.append(o.decode_error)
            if isinstance(o, RunOutcome) and o.ill_conditioned:
                ill.append(
                    {
                        "program": rjobs[i][1],
                        "decode_error_fp32": o.decode_error,
                        "forward_fp32_vs_fp64": o.forward_error,
                        "decode_error_fp64": o.decode_error_fp64,
                    }
                )

        run_phase(ran, rjobs, args, progress, on_run)
    finite = [e for e in errors if math.isfinite(e)]
    return {
        "command": command(args),
        "mutant_inputs": len(data),
        "programs_accepted": len(accepted),
        "decode_error_max": max(finite, default=None),
        "decode_error_median": sorted(finite)[len(finite) // 2] if finite else None,
        "decode_beyond_tolerance_fp32": sum(e > DECODE_RTOL for e in finite),
        "ill_conditioned": ill,
        "phases": {p.name: p.as_dict() for p in (mut, gen, ran)},
        "_errors": errors,
    }


def command(args) -> str:
    flags = ("programs", "mutants", "run", "seed", "timeout", "jobs")
    return "python -m lt2dsl.fuzz " + " ".join(f"--{k} {getattr(args, k)}" for k in flags)


def table(summary: dict) -> Table:
    t = Table(title=f"lt2dsl reliability · {summary['command']}", title_justify="left")
    for col in ("phase", "jobs", "failures", "seconds"):
        t.add_column(col, justify="left" if col in ("phase", "failures") else "right")
    for name, p in summary["phases"].items():
        fails = ", ".join(f"{k}: {v}" for k, v in p["failures"].items()) or "none"
        t.add_row(name, f"{p['jobs']:,}", fails, f"{p['seconds']:.0f}")
    return t


def histogram(errors: list[float], path: Path) -> bool:
    """A PNG of the decode errors (log scale) where matplotlib is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist([math.log10(max(e, 1e-12)) for e in errors], bins=40)
    ax.axvline(math.log10(DECODE_RTOL), color="red", linestyle="--", label="tolerance 1e-4")
    ax.set_xlabel("log10 max |decode − forward| / max |forward| (fp32)")
    ax.set_ylabel("programs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_json(path: Path, obj: dict) -> None:
    """Atomically: a reader never sees half a report."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = campaign(args)
    errors = summary.pop("_errors")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "summary.json", summary)
    console = Console()
    console.print(table(summary))
    console.print(
        f"accepted {summary['programs_accepted']:,} of {args.programs:,} programs; fp32 decode error "
        f"max {summary['decode_error_max']:.1e}, median {summary['decode_error_median']:.1e}; "
        f"{summary['decode_beyond_tolerance_fp32']} beyond {DECODE_RTOL:g}, of which "
        f"{len(summary['ill_conditioned'])} ill-conditioned (fp32 forward off float64) with an "
        "exact float64 decode"
    )
    if histogram(errors, args.out / "decode_errors.png"):
        console.print(f"wrote {args.out / 'decode_errors.png'}")
    console.print(f"wrote {args.out / 'summary.json'}")
    return 0 if not any(p["failures"] for p in summary["phases"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
