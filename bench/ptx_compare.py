"""The sm_90 PTX of every compile job, saved and compared: a refactor's proof that the kernels the
GPU runs did not change, without a GPU.

    PYTHONPATH=.tcache/triton-3.6.0:. python bench/ptx_compare.py dump before/ --families attn,fused
    ... change the kernels ...
    PYTHONPATH=.tcache/triton-3.6.0:. python bench/ptx_compare.py dump after/ --families attn,fused
    python bench/ptx_compare.py compare before/ after/

`dump` compiles the jobs of `lt2dsl.kernels.common.aot.all_jobs` (those of the named families: the
part of a job's name before "/") with the Triton on the import path, line info off (so comments and
moved lines change nothing), and writes each job's PTX to `<folder>/<job>.ptx` with an `index.json`.
`compare` pairs the jobs by name and tells identical, different and unpaired jobs apart, after
renaming the kernel (`.entry`) and its device functions (`.func`) to placeholders: a kernel renamed
or merged into another with a constexpr switch compares equal when its instructions are. Exit
status 1 when a paired job's PTX differs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
import tempfile
from pathlib import Path

_JOBS: list = []  # the jobs of this run, read by the forked workers


def _file(name: str) -> str:
    return name.replace("/", "__") + ".ptx"


def _compile(i: int) -> tuple[int, str]:
    import triton
    from triton.backends.compiler import GPUTarget

    from lt2dsl.kernels.common.aot import source

    job = _JOBS[i]
    opts = {"num_warps": job.num_warps, "num_stages": job.num_stages}
    try:
        return i, triton.compile(source(job), target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
    except Exception as e:  # a job that does not compile is reported, not fatal
        return i, f"// does not compile: {type(e).__name__}: {str(e).splitlines()[:1]}"


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def dump(folder: Path, families: list[str] | None, workers: int) -> int:
    """Compile the families' jobs and write their PTX and `index.json` into `folder`."""
    global _JOBS
    from lt2dsl.kernels.common import aot

    _JOBS = [j for j in aot.all_jobs() if families is None or j.name.split("/")[0] in families]
    folder.mkdir(parents=True, exist_ok=True)
    pool = multiprocessing.get_context("fork").Pool(workers) if workers > 1 else None
    done = pool.imap_unordered(_compile, range(len(_JOBS))) if pool else map(_compile, range(len(_JOBS)))
    index = {}
    for n, (i, ptx) in enumerate(done, 1):
        job = _JOBS[i]
        _write(folder / _file(job.name), ptx)
        index[job.name] = {"kernel": job.kernel_name, "warps": job.num_warps, "stages": job.num_stages}
        print(f"[{n}/{len(_JOBS)}] {job.name}", flush=True)
    if pool:
        pool.close()
        pool.join()
    _write(folder / "index.json", json.dumps(index, indent=1, sort_keys=True))
    return 0


def normalise(ptx: str) -> str:
    """The PTX with its kernel named KERNEL, its device functions FUNC0, FUNC1, ... (in order of
    definition) and the header comments dropped."""
    names = re.findall(r"\.entry\s+(\w+)", ptx)
    names += [f for f in re.findall(r"\.func\s+(?:\([^)]*\)\s*)?(\w+)\s*\(", ptx) if f not in names]
    lines = [ln for ln in ptx.splitlines() if not ln.lstrip().startswith("//")]
    text = "\n".join(lines)
    for i, name in enumerate(dict.fromkeys(names)):
        text = re.sub(rf"\b{re.escape(name)}(?=\b|_param_)", "KERNEL" if i == 0 else f"FUNC{i}", text)
    return text


def _index(folder: Path, families: list[str] | None) -> dict:
    index = json.loads((folder / "index.json").read_text())
    return {n: v for n, v in index.items() if families is None or n.split("/")[0] in families}


def compare(before: Path, after: Path, families: list[str] | None = None) -> dict:
    """{identical, different, only_before, only_after}: job names (of `families`, default all), by
    the normalised PTX."""
    a, b = _index(before, families), _index(after, families)
    out = {"identical": [], "different": [], "only_before": sorted(set(a) - set(b)), "only_after": []}
    out["only_after"] = sorted(set(b) - set(a))
    for name in sorted(set(a) & set(b)):
        same = normalise((before / _file(name)).read_text()) == normalise((after / _file(name)).read_text())
        out["identical" if same else "different"].append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="compile the jobs and save their PTX")
    d.add_argument("folder", type=Path)
    d.add_argument("--families", default=None, help="comma-separated job families (default: all)")
    d.add_argument("--workers", type=int, default=2)
    c = sub.add_parser("compare", help="compare two dumps job by job")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--families", default=None, help="comma-separated job families (default: all)")
    c.add_argument("--json", type=Path, default=None, help="write the comparison here")
    args = ap.parse_args(argv)
    families = args.families.split(",") if args.families else None
    if args.cmd == "dump":
        os.environ.pop("TRITON_INTERPRET", None)
        os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
        os.environ.setdefault("TRITON_CACHE_DIR", str(Path(".tcache/ptx").resolve()))
        return dump(args.folder, families, args.workers)
    res = compare(args.before, args.after, families)
    if args.json is not None:
        _write(args.json, json.dumps(res, indent=1))
    for key in ("different", "only_before", "only_after"):
        for name in res[key]:
            print(f"{key.upper()} {name}")
    print(
        f"PTX of {len(res['identical']) + len(res['different'])} paired jobs: {len(res['identical'])} "
        f"identical, {len(res['different'])} different; {len(res['only_before'])} only before, "
        f"{len(res['only_after'])} only after"
    )
    return 1 if res["different"] else 0


if __name__ == "__main__":
    sys.exit(main())
