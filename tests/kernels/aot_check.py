"""Compile every Triton kernel's jobs for sm_90 with the Triton on `sys.path`, and check each.

The GPU runs the Triton its PyTorch ships (pinned once, as GPU_TRITON in the Makefile); the CPU
tests run another under the interpreter. This runs the first's real pipeline, down to a cubin with
its bundled ptxas, for every job of `lt2dsl.kernels.common.aot.all_jobs` (each kernel at every
config its launch code may pick), with no GPU:

    PYTHONPATH=.tcache/triton-3.6.0 python -m tests.kernels.aot_check --workers 2 --json out.json

(`make sm90` does this.) A job fails on a compile error (naming the kernel, the file and the line),
on shared memory over the sm_90 limit, on the pipelining hazard of `bench/ttgir_checks.py`,
and on spills over the job's `max_stack`; the run also fails when a kernel has no job. Jobs run in
`--workers` forked processes; a passing job's result is cached under `--cache`, keyed by Triton's
hash of the kernel source with its helpers and constexprs, the signature and options, the Triton
version and this checker's own source. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMEM_LIMIT = 232448  # bytes of shared memory a block may have on sm_90 (227 KiB)
_JOBS: list = []  # the jobs of this run, read by the forked workers


def _checker_hash() -> str:
    text = Path(__file__).read_bytes() + (ROOT / "bench" / "ttgir_checks.py").read_bytes()
    return hashlib.sha256(text).hexdigest()[:16]


def cache_key(job) -> str:
    """Triton's hash of the source (kernel, helpers, constexprs, signature, attributes), the launch
    options, the Triton version and this checker."""
    import triton

    from lt2dsl.kernels.common.aot import source

    key = [
        source(job).hash(),
        job.num_warps,
        job.num_stages,
        job.max_stack,
        triton.__version__,
        _checker_hash(),
    ]
    return hashlib.sha256(repr(key).encode()).hexdigest()


def _stack_and_registers(cubin: bytes) -> tuple[int, int]:
    import triton

    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True)
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", out.stdout)
    return (int(m.group(2)), int(m.group(1))) if m else (-1, -1)


def compile_job(job) -> dict:
    """{shared, registers, stack, hazards} of the job's sm_90 build (raises on a compile error)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from bench.ttgir_checks import pipeline_hazards
    from lt2dsl.kernels.common.aot import source

    opts = {"num_warps": job.num_warps, "num_stages": job.num_stages}
    kernel = triton.compile(source(job), target=GPUTarget("cuda", 90, 32), options=opts)
    stack, regs = _stack_and_registers(kernel.asm["cubin"])
    hazards = [list(map(str, h)) for h in pipeline_hazards(kernel.asm["ttgir"])]
    return {"shared": kernel.metadata.shared, "registers": regs, "stack": stack, "hazards": hazards}


def problems(job, res: dict) -> list[str]:
    """What is wrong with a compiled job's resources, in words (empty when it passes)."""
    out = []
    if res["shared"] > SMEM_LIMIT:
        out.append(f"{res['shared']} B of shared memory > the sm_90 limit {SMEM_LIMIT}")
    if res["hazards"]:
        out.append(
            "single-buffered operands of asynchronous wgmma dots while dots stay pending "
            f"(the pipelining race, ttgir_checks): {res['hazards']}"
        )
    if job.max_stack is not None and res["stack"] > job.max_stack:
        out.append(f"{res['stack']} B of spills per thread > {job.max_stack}")
    return out


def _error_chain(exc: BaseException) -> list[BaseException]:
    chain, e = [], exc
    while e is not None and len(chain) < 16:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def describe_error(exc: BaseException, functions: list) -> str:
    """`file:line (function) → ... : error` for a compile error: each source line of the chain of
    Triton `CompilationError`s (the kernel's call site first, down into the helpers), then the
    underlying error."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.jit import get_jit_fn_file_line

    by_src = {f.src: f for f in functions}
    where, last = [], exc
    for e in _error_chain(exc):
        last = e
        if not isinstance(e, CompilationError):
            continue
        fn = by_src.get(e.src)
        line = getattr(e.node, "lineno", None)
        if fn is None or line is None:
            continue
        file, begin = get_jit_fn_file_line(fn)
        rel = os.path.relpath(file, ROOT) if file.startswith(str(ROOT)) else file
        where.append(f"{rel}:{begin + line - 1} ({fn.__name__})")
    if isinstance(last, CompilationError):
        msg = last.error_message or "compile error"
    else:
        text = str(last).strip().splitlines()
        msg = f"{type(last).__name__}: {text[0] if text else ''}".strip()
    return " -> ".join([*where, msg]) if where else msg


def _run(i: int) -> tuple[int, dict]:
    """Compile job i in a worker: its result, or its error in words."""
    from lt2dsl.kernels.common.aot import jit_functions

    job = _JOBS[i]
    t, cpu = time.perf_counter(), _cpu_seconds()
    try:
        res = compile_job(job)
    except Exception as e:  # a compile error is this job's result, not the run's end
        res = {"error": describe_error(e, jit_functions())}
    res["seconds"] = round(time.perf_counter() - t, 2)
    res["cpu_seconds"] = round(_cpu_seconds() - cpu, 2)
    return i, res


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (ptxas, cuobjdump)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


class ResultCache:
    """Passing jobs' results in `folder`, one JSON file per key; a run's job times, for ordering."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self.times = {}
        if folder is not None and (folder / "seconds.json").exists():
            self.times = json.loads((folder / "seconds.json").read_text())

    def get(self, key: str) -> dict | None:
        f = None if self.folder is None else self.folder / "results" / f"{key}.json"
        return json.loads(f.read_text()) if f is not None and f.exists() else None

    def put(self, key: str, res: dict) -> None:
        if self.folder is not None:
            _write_json(self.folder / "results" / f"{key}.json", res)

    def save_times(self, results: dict[str, dict]) -> None:
        if self.folder is not None:
            self.times.update({n: r["seconds"] for n, r in results.items() if "seconds" in r})
            _write_json(self.folder / "seconds.json", self.times)


def run_jobs(jobs: list, workers: int, cache: ResultCache) -> dict[str, dict]:
    """Each job's result by name: cached, or compiled in `workers` forked processes (the jobs that
    took longest last time first)."""
    global _JOBS
    _JOBS = jobs
    results, keys, todo = {}, {}, []
    for i, job in enumerate(jobs):
        keys[i] = cache_key(job)
        hit = cache.get(keys[i])
        if hit is not None:
            results[job.name] = dict(hit, cached=True)
        else:
            todo.append(i)
    todo.sort(key=lambda i: -cache.times.get(jobs[i].name, 0.0))
    done = map(_run, todo)
    pool = None
    if workers > 1 and len(todo) > 1:
        pool = multiprocessing.get_context("fork").Pool(workers)
        done = pool.imap_unordered(_run, todo)
    try:
        for i, res in done:
            results[jobs[i].name] = res
            if "error" not in res and not problems(jobs[i], res):
                cache.put(keys[i], res)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return results


def report(jobs: list, results: dict[str, dict], missing: list[str]) -> list[str]:
    """One line per failure: the kernel, the job (config) and what is wrong."""
    lines = [f"no compile job for kernel {k} (add one to its family's aot_jobs.py)" for k in missing]
    for job in jobs:
        res = results[job.name]
        label = f"{job.kernel_name} [{job.name}, {job.num_warps} warps, {job.num_stages} stages]"
        if "error" in res:
            lines.append(f"{label}: does not compile: {res['error']}")
        else:
            lines += [f"{label}: {p}" for p in problems(job, res)]
    return lines


def inventory(jobs: list, missing: list[str]) -> int:
    """Print the jobs per family and the kernels without one; 1 if there are any."""
    import triton

    families: dict[str, int] = {}
    for job in jobs:
        fam = job.name.split("/")[0]
        families[fam] = families.get(fam, 0) + 1
    print(", ".join(f"{f} {n}" for f, n in sorted(families.items())))
    for k in missing:
        print(f"FAIL no compile job for kernel {k} (add one to its family's aot_jobs.py)")
    kernels = len({j.kernel_name for j in jobs})
    print(f"Triton {triton.__version__}: {len(jobs)} jobs of {kernels} kernels, ", end="")
    print(f"{len(missing)} kernels without a job")
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="compile processes (default 2)")
    ap.add_argument(
        "--cache", type=Path, default=None, help="folder caching passing jobs and Triton's builds"
    )
    ap.add_argument("--json", type=Path, default=None, help="write every job's result here")
    ap.add_argument("--only", default=None, help="only the jobs whose name contains this text")
    ap.add_argument(
        "--list", action="store_true", help="count the jobs and check every kernel has one; no compile"
    )
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    if args.cache is not None:
        os.environ.setdefault(
            "TRITON_CACHE_DIR", str((args.cache / f"triton-{triton.__version__}").resolve())
        )
    from lt2dsl.kernels.common import aot

    t0 = time.perf_counter()
    every = aot.all_jobs()
    missing = aot.uncovered(aot.kernels(aot.jit_functions()), every)
    if args.list:
        return inventory(every, missing)
    jobs = [j for j in every if args.only is None or args.only in j.name]
    cache = ResultCache(args.cache)
    results = run_jobs(jobs, args.workers, cache)
    cache.save_times(results)
    failures = report(jobs, results, missing if args.only is None else [])
    seconds = time.perf_counter() - t0
    cached = sum(1 for r in results.values() if r.get("cached"))
    cpu = sum(r.get("cpu_seconds", 0.0) for r in results.values() if not r.get("cached"))
    summary = {
        "triton": triton.__version__,
        "jobs": len(jobs),
        "kernels": len({j.kernel_name for j in jobs}),
        "cached": cached,
        "failures": failures,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
    }
    if args.json is not None:
        rows = {j.name: dict(results[j.name], kernel=j.kernel_name) for j in jobs}
        _write_json(args.json, {**summary, "results": rows})
    for line in failures:
        print("FAIL", line)
    print(
        f"sm_90 compile check, Triton {triton.__version__}: {len(jobs)} jobs of {summary['kernels']} kernels "
        f"({cached} cached), {len(failures)} failures, {seconds:.0f} s with {args.workers} workers "
        f"({cpu:.0f} s of compile CPU time)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
