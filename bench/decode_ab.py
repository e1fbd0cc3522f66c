"""Whole-model decode tok/s of this tree against a base tree's, in one process chain on one card.

A kernel change is judged by the same points measured by both trees on the same card in the same
call (cards of one kind differ by a few percent). `--base DIR` is a folder holding another
commit's `lt2dsl/` package (`make ab-base COMMIT=...` writes `.ab_base/`, with the commit's hash
in `.ab_base/COMMIT`; carry it to the GPU machine). For each of `--rounds` rounds, `lt2dsl bench
decode` runs the files once with this tree and once with the base, alternating which goes first,
each in its own process with that tree first on `PYTHONPATH`; the JSON of every run is kept under
`--out`. The table gives per (model, batch, context) the median tok/s of each tree over the
rounds, new / base, and each against the estimate of `--hw` (this tree's estimate: the base's may
count kernels differently). Points a run did not reach (out of memory, cut by `--timeout`) show
as such. `--profile` then runs `bench/decode_profile.py` at the same points with each tree's package
(checked: the profile names the package it loaded) and prints, per point, both steps and the
kernels whose time changed most (`profile` in ab.json): where a change gains or loses, by kernel.

    make ab-base COMMIT=8ea956f                                           # here
    python bench/decode_ab.py examples/lt2_sparse_dsa.lt2 examples/lt2_sparse_nsa.lt2 \\
        --base .ab_base --ctx 4k,32k --batch 1,8 --hw h100-measured --profile --out $OUT/ab   # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lt2dsl.train.files import atomic_write  # noqa: E402

TREES = ("new", "base")


def run_in(root: Path, cmd: list[str], args, log_path: Path) -> int:
    """`cmd` (and `--set` of args) with `root`'s package first on the path, output to `log_path`;
    the return code (124 where it ran past `--timeout`: what it finished is in its output files)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    for kv in args.set:
        cmd = [*cmd, "--set", kv]
    with open(log_path, "w") as log:
        try:
            return subprocess.run(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=args.timeout).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            return 124


def run_tree(root: Path, files: list[Path], args, json_path: Path, log_path: Path) -> int:
    """`lt2dsl bench decode` of the files with `root`'s package (`run_in`)."""
    cmd = [sys.executable, "-m", "lt2dsl", "bench", "decode", *map(str, files), "--ctx", args.ctx,
           "--batch", args.batch, "--steps", str(args.steps), "--warm", str(args.warm),
           "--json", str(json_path), *(["--hw", args.hw] if args.hw else [])]  # fmt: skip
    return run_in(root, cmd, args, log_path)


def profile_tree(root: Path, files: list[Path], args, out: Path, log_path: Path) -> tuple[int, dict | None]:
    """`bench/decode_profile.py` (this checkout's script) of the files with `root`'s package
    (`run_in`): (return code, its JSON). A profile of another package than `root`'s is an error (1)."""
    cmd = [sys.executable, str(ROOT / "bench" / "decode_profile.py"), *map(str, files), "--ctx", args.ctx,
           "--batch", args.batch, "--steps", str(args.steps), "--warm", str(args.warm),
           "--profiled", str(args.profiled), "--out", str(out)]  # fmt: skip
    code = run_in(root, cmd, args, log_path)
    path = out / "decode_profile.json"
    if code != 0 or not path.is_file():
        return code or 1, None
    info = json.loads(path.read_text())
    if Path(info.get("package", "")) != (root / "lt2dsl").resolve():
        with open(log_path, "a") as log:
            log.write(f"\nprofiled {info.get('package')}, expected {root / 'lt2dsl'}\n")
        return 1, None
    return 0, info


def kernel_diff(new: dict | None, base: dict | None, top: int = 12) -> list[dict]:
    """Per point both trees profiled: each step's µs and kernels, and the `top` kernels by how much
    their µs a step changed (new − base; a kernel one tree lacks counts 0 there)."""
    if not new or not base:
        return []
    rows = []
    base_rows = {(r["model"], r["batch"], r["ctx"]): r for r in base["rows"]}
    for r in new["rows"]:
        b = base_rows.get((r["model"], r["batch"], r["ctx"]))
        if b is None:
            continue
        n_us = {k["name"]: k["us"] for k in r["by_name"]}
        b_us = {k["name"]: k["us"] for k in b["by_name"]}
        names = sorted(set(n_us) | set(b_us), key=lambda k: -abs(n_us.get(k, 0.0) - b_us.get(k, 0.0)))
        rows.append({
            "model": r["model"], "batch": r["batch"], "ctx": r["ctx"],
            "new_step_us": r["step_us"], "base_step_us": b["step_us"],
            "new_kernels": r["kernels"], "base_kernels": b["kernels"],
            "kernels": [
                {"name": k, "new_us": n_us.get(k, 0.0), "base_us": b_us.get(k, 0.0)} for k in names[:top]
            ],
        })  # fmt: skip
    return rows


def diff_table(row: dict) -> Table:
    t = Table(
        title=f"{row['model']} B={row['batch']} L={row['ctx']}: step {row['new_step_us']:,.0f} µs "
        f"({row['new_kernels']:,.0f} kernels) against {row['base_step_us']:,.0f} ({row['base_kernels']:,.0f})"
    )
    for col in ("kernel", "new µs/step", "base µs/step", "new − base"):
        t.add_column(col, justify="left" if col == "kernel" else "right")
    for k in row["kernels"]:
        new, base = k["new_us"], k["base_us"]
        t.add_row(k["name"][:60], f"{new:,.0f}", f"{base:,.0f}", f"{new - base:+,.0f}")
    return t


def points(path: Path) -> list[dict]:
    """The points a run wrote (none where it wrote no JSON)."""
    if not path.exists():
        return []
    return json.loads(path.read_text()).get("points", [])


def summarize(runs: dict[str, list[list[dict]]]) -> list[dict]:
    """Per (model, batch, ctx): each tree's tok/s over the rounds (median), new / base, and each
    against this tree's estimate. A point out of memory in every round of a tree is `oom`."""
    keys: dict[tuple, None] = {}
    by: dict[tuple, dict[str, list[dict]]] = {}
    for tag, rounds in runs.items():
        for pts in rounds:
            for p in pts:
                k = (p["model"], p["batch"], p["ctx"])
                keys.setdefault(k)
                by.setdefault(k, {}).setdefault(tag, []).append(p)
    rows = []
    for k in keys:
        row: dict = {"model": k[0], "batch": k[1], "ctx": k[2]}
        est = next((p.get("estimate_tok_s") for p in by[k].get("new", []) if p.get("estimate_tok_s")), None)
        row["estimate_tok_s"] = est
        for tag in TREES:
            pts = by[k].get(tag, [])
            tok = [p["tok_s"] for p in pts if not p.get("oom") and p.get("tok_s")]
            row[f"{tag}_tok_s"] = statistics.median(tok) if tok else None
            row[f"{tag}_runs"] = len(tok)
            row[f"{tag}_oom"] = bool(pts) and not tok and all(p.get("oom") for p in pts)
            row[f"{tag}_of_estimate"] = row[f"{tag}_tok_s"] / est if tok and est else None
        n, b = row["new_tok_s"], row["base_tok_s"]
        row["new_over_base"] = n / b if n and b else None
        rows.append(row)
    return rows


def table(rows: list[dict], title: str) -> Table:
    t = Table(title=title)
    for col in ("model", "B", "ctx", "new tok/s", "base tok/s", "new / base", "new / est", "base / est"):
        t.add_column(col, justify="left" if col == "model" else "right")

    def tok(r: dict, tag: str) -> str:
        if r[f"{tag}_oom"]:
            return "oom"
        v = r[f"{tag}_tok_s"]
        return "-" if v is None else f"{v:,.1f} ({r[f'{tag}_runs']})"

    def num(v) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        t.add_row(r["model"], str(r["batch"]), str(r["ctx"]), tok(r, "new"), tok(r, "base"),
                  num(r["new_over_base"]), num(r["new_of_estimate"]), num(r["base_of_estimate"]))  # fmt: skip
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help=".lt2 files")
    ap.add_argument("--base", type=Path, required=True, help="a folder holding the base tree's lt2dsl/")
    ap.add_argument("--ctx", default="4k,32k", help="prompt lengths [4k,32k]")
    ap.add_argument("--batch", default="1,8", help="batch sizes [1,8]")
    ap.add_argument("--hw", default=None, help="the estimate's hardware preset [the device's card]")
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps a point [32]")
    ap.add_argument("--warm", type=int, default=4, help="untimed decode steps before them [4]")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a model setting"
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="runs of each tree, alternating which goes first [1]"
    )
    ap.add_argument("--timeout", type=float, default=None, help="seconds a run may take [none]")
    ap.add_argument("--profile", action="store_true", help="then profile both trees' steps, kernel by kernel")
    ap.add_argument("--profiled", type=int, default=8, help="steps a --profile run records [8]")
    ap.add_argument("--out", type=Path, required=True, help="folder of the runs' JSON and logs, and ab.json")
    args = ap.parse_args(argv)
    console = Console(width=150)
    if not (args.base / "lt2dsl" / "__init__.py").is_file():
        console.print(
            f"error: {args.base} holds no lt2dsl/ package (make ab-base COMMIT=... writes .ab_base/)"
        )
        return 2
    if args.rounds < 1:
        console.print("error: --rounds must be at least 1")
        return 2
    files = [f.resolve() for f in args.files]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        console.print(f"error: no such file: {', '.join(missing)}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    roots = {"new": ROOT, "base": args.base.resolve()}
    runs: dict[str, list[list[dict]]] = {tag: [] for tag in TREES}
    codes = {}
    for r in range(args.rounds):
        for tag in TREES if r % 2 == 0 else TREES[::-1]:
            console.print(f"round {r + 1}/{args.rounds}: {tag} ({roots[tag]})")
            js, log = args.out / f"decode_{tag}_{r}.json", args.out / f"decode_{tag}_{r}.log"
            codes[f"{tag}_{r}"] = run_tree(roots[tag], files, args, js, log)
            runs[tag].append(points(js))
    rows = summarize(runs)
    profiles = {}
    for tag in TREES if args.profile else ():
        console.print(f"profile: {tag} ({roots[tag]})")
        out, log = args.out / f"profile_{tag}", args.out / f"profile_{tag}.log"
        codes[f"profile_{tag}"], profiles[tag] = profile_tree(roots[tag], files, args, out, log)
    diffs = kernel_diff(profiles.get("new"), profiles.get("base"))
    base_commit = args.base / "COMMIT"
    info = {
        "base": str(args.base),
        "base_commit": base_commit.read_text().strip() if base_commit.is_file() else None,
        "device": next(
            (json.loads(p.read_text()).get("device") for p in sorted(args.out.glob("decode_*.json"))), None
        ),
        "hw": args.hw,
        "rounds": args.rounds,
        "return_codes": codes,
        "rows": rows,
        "profile": diffs,
    }
    atomic_write(args.out / "ab.json", json.dumps(info, indent=2) + "\n")
    title = f"decode tok/s, this tree against {info['base_commit'] or args.base} ({info['device']})"
    for row in diffs:
        console.print(diff_table(row))
    console.print(table(rows, title))
    failed = {k: c for k, c in codes.items() if c != 0}
    if failed:
        console.print(f"[red]runs that did not finish: {failed} (their logs under {args.out})[/red]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
