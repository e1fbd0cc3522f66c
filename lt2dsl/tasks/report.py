"""Tables, JSON and PNG of evaluations and experiments (rich for people, JSON for machines).

`eval_table(report)`: one evaluation, a row per (variant, slice bucket). `summarize(exp, results)`:
an experiment's per-run means over seeds and each check's verdict; `write_summary` writes it as
`results.json`, `results.md` and `results.png` (matplotlib, Agg) into the experiment's folder.
"""

from __future__ import annotations

import io
import json
import math
import os
import statistics
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from rich.table import Table

from lt2dsl.tasks.eval import EvalReport
from lt2dsl.tasks.experiment_config import CheckConfig, ExperimentConfig


def eval_table(report: EvalReport) -> Table:
    """Accuracy per variant, overall then by slice bucket."""
    t = Table(title=f"{report.task}: exact match on the test split (seed {report.seed})")
    for col in ("variant", "slice", "bucket", "accuracy", "answers"):
        t.add_column(col, justify="right" if col in ("accuracy", "answers") else "left")
    for name, v in report.variants.items():
        acc = f"{v.overall.accuracy:.4f} (rows {v.overall.sequence_accuracy:.4f})"
        t.add_row(name or report.task, "all", "", acc, str(v.overall.total))
        for s, buckets in v.slices.items():
            for b, tally in buckets.items():
                t.add_row("", s, b, f"{tally.accuracy:.4f}", str(tally.total))
    return t


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a file whole or not at all (a temp file in the same folder, then `os.replace`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make results unreadable to others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=True) + "\n")


# ---- experiments --------------------------------------------------------------------------------


def summarize(exp: ExperimentConfig, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run and metric: seed values, mean, std; per check: the verdict on the means; `missing`:
    each (run, data entry, seed) of the experiment that `results` lacks."""
    runs: dict[str, dict[str, Any]] = {}
    for r in exp.runs:
        mine = [x for x in results if x["run"] == r.name]
        metrics = {}
        for m in sorted({k for x in mine for k in x["metrics"]}):
            vals = {f"{x['data']}/seed{x['seed']}": x["metrics"][m] for x in mine if m in x["metrics"]}
            metrics[m] = _stats(list(vals.values())) | {"values": vals}
        params = next((x["params"] for x in mine), None)
        steps = _stats([x.get("steps") for x in mine])
        runs[r.name] = {"params": params, "metrics": metrics, "steps": steps}
    checks = [verdict(c, runs) for c in exp.checks]
    done = {(x["run"], x["data"], x["seed"]) for x in results}
    missing = [
        {"run": r.name, "data": d.name, "seed": s}
        for r in exp.runs
        for s in exp.seeds
        for d in exp.data
        if (r.name, d.name, s) not in done
    ]
    return {
        "name": exp.name,
        "claim": exp.claim,
        "seeds": exp.seeds,
        # where the trainings ran: a table mixing cards (or a CPU) says so
        "devices": sorted({str(x.get("device", "unknown")) for x in results}),
        "runs": runs,
        "checks": checks,
        "missing": missing,
    }


def _stats(values: list[float]) -> dict[str, float | int]:
    ok = [v for v in values if v is not None and not math.isnan(v)]
    if not ok:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    return {"mean": statistics.fmean(ok), "std": statistics.pstdev(ok) if len(ok) > 1 else 0.0, "n": len(ok)}


def verdict(check: CheckConfig, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`agrees`, `disagrees`, `within noise` or `not run` for one check, with the means it compared.

    A `greater` check agrees when the means differ by more than the larger of the two runs' seed
    standard deviations in its direction, disagrees by more than that the other way, and is within
    noise otherwise (two runs at chance differ by a hair either way; neither way is evidence).
    """

    def stat(run: str | None, key: str) -> float:
        return runs.get(run, {}).get("metrics", {}).get(check.metric, {}).get(key, float("nan"))

    a = stat(check.run, "mean")
    if check.kind == "greater":
        b = stat(check.than, "mean")
        margin = max(stat(check.run, "std"), stat(check.than, "std"))
        detail = f"{check.run} {a:.4g} vs {check.than} {b:.4g} (seed std up to {margin:.2g})"
        held = None if abs(a - b) <= margin else a > b
    else:
        b = check.value
        held = a >= b if check.kind == "at_least" else a <= b
        detail = f"{check.run} {a:.4g} {'>=' if check.kind == 'at_least' else '<='} {b:.4g}?"
    if math.isnan(a) or math.isnan(b):
        return {"says": check.says, "verdict": "not run", "detail": detail}
    word = "within noise" if held is None else "agrees" if held else "disagrees"
    return {"says": check.says, "verdict": word, "detail": detail}


def _cell(stat: dict[str, Any] | None) -> str:
    if not stat or not stat["n"]:
        return "—"
    return f"{stat['mean']:.3f} ± {stat['std']:.3f} ({stat['n']})"


def summary_table(exp: ExperimentConfig, summary: dict[str, Any]) -> Table:
    t = Table(title=f"{exp.name}: {exp.claim}")
    t.add_column("run")
    t.add_column("params", justify="right")
    for m in exp.metrics:
        t.add_column(f"{m}\nmean ± std (seeds)", justify="right")
    for name, r in summary["runs"].items():
        params = f"{r['params']:,}" if r["params"] else "—"
        t.add_row(name, params, *(_cell(r["metrics"].get(m)) for m in exp.metrics))
    return t


def markdown(exp: ExperimentConfig, summary: dict[str, Any], command: str) -> str:
    """`results.md`: the claim, the command, the table and the checks' verdicts."""
    lines = [f"# {exp.name}", "", f"Claim: {exp.claim}", "", f"Command: `{command}`", ""]
    lines += [f"Seeds: {', '.join(map(str, exp.seeds))}; cells are mean ± std over seeds (count).", ""]
    if summary.get("devices"):
        lines += [f"Trained on: {', '.join(summary['devices'])}.", ""]
    head = ["run", "params", "steps", *exp.metrics]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in summary["runs"].items():
        steps = r.get("steps") or {}  # mean steps over seeds: a run that met its threshold stopped early
        cells = [name, f"{r['params']:,}" if r["params"] else "—"]
        cells.append(f"{steps['mean']:.0f}" if steps.get("n") else "—")
        lines.append("| " + " | ".join(cells + [_cell(r["metrics"].get(m)) for m in exp.metrics]) + " |")
    lines += ["", "| check | verdict | means |", "|---|---|---|"]
    lines += [f"| {c['says']} | {c['verdict']} | {c['detail']} |" for c in summary["checks"]]
    missing = summary.get("missing", [])
    if missing:
        total = len(exp.runs) * len(exp.seeds) * len(exp.data)
        head = f"Incomplete: {len(missing)} of {total} trainings have no result yet (run the command again):"
        lines += ["", head, ""]
        lines += [f"- {m['run']} · {m['data']} · seed {m['seed']}" for m in missing]
    return "\n".join(lines) + "\n"


def plot(exp: ExperimentConfig, summary: dict[str, Any], path: Path) -> None:
    """One panel per metric: the mean of each run as a bar, each seed as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["runs"])
    fig, axes = plt.subplots(1, len(exp.metrics), figsize=(max(4.0, 0.9 * len(names)) * len(exp.metrics), 4))
    axes = [axes] if len(exp.metrics) == 1 else list(axes)
    for ax, m in zip(axes, exp.metrics):
        for i, name in enumerate(names):
            st = summary["runs"][name]["metrics"].get(m)
            if not st or not st["n"]:
                continue
            ax.bar(i, st["mean"], color="#7aa6c2")
            vals = [v for v in st["values"].values() if v is not None and not math.isnan(v)]
            ax.scatter([i] * len(vals), vals, color="black", s=12, zorder=3)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_title(m)
    fig.suptitle(exp.claim, fontsize=9)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)


def write_archive(out: Path, path: Path) -> Path:
    """`path` (a `.tar.gz`): the summary, the result files and the logs of the results folder
    `out`, under `<out's name>/`, so one file carries a whole experiment; written atomically."""
    names = ["results.json", "results.md", "results.png"]
    members = [out / n for n in names] + sorted((out / "runs").glob("*.json"))
    members += sorted((out / "logs").glob("*.log"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m in members:
            if m.is_file():
                tar.add(m, arcname=str(Path(out.name) / m.relative_to(out)))
    atomic_write(path, buf.getvalue())
    return path


def write_summary(exp: ExperimentConfig, summary: dict[str, Any], out: Path, command: str) -> list[Path]:
    """`results.json`, `results.md`, `results.png` in `out`; returns their paths."""
    paths = [out / "results.json", out / "results.md", out / "results.png"]
    write_json(paths[0], summary)
    atomic_write(paths[1], markdown(exp, summary, command))
    plot(exp, summary, paths[2])
    return paths
