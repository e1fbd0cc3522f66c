"""Whether a kernel change leaves the sm_90 code alone: the PTX of every compile job, at a base
revision and in the working tree, compared kernel by kernel with no GPU.

A refactor that moves a kernel's body into `@triton.jit` helpers is inlined by Triton; when the
PTX of every specialisation is the same as the base's, ptxas makes the same cubin and the GPU
timings cannot move. Each side compiles with `tests.kernels.aot_check` (the GPU's Triton on
`sys.path`) into a fresh cache of its own; debug lines (`.loc`, `.file`, the debug sections,
`$L__tmp` labels) are dropped before comparing, since they name source lines:

    PYTHONPATH=.tcache/triton-3.6.0 python -m tests.kernels.ptx_diff main --only delta

Exit status 0 when every kernel present on either side has the same set of PTX texts, else 1.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_DEBUG_LABEL = re.compile(r"\$L__tmp\d+:")


def normalised(ptx: str) -> str:
    """`ptx` without comments, blank lines and debug information."""
    out = []
    for line in ptx.splitlines():
        if line.lstrip().startswith(".section") and ".debug" in line:
            break  # the debug sections come last
        line = line.split("//")[0].rstrip()
        s = line.strip()
        if s and not s.startswith((".loc", ".file")) and not _DEBUG_LABEL.fullmatch(s):
            out.append(line)
    return "\n".join(out)


def ptx_by_kernel(triton_cache: Path) -> dict[str, list[str]]:
    """Kernel name → the sorted normalised PTX of each of its specialisations in a Triton cache."""
    got: dict[str, list[str]] = collections.defaultdict(list)
    for path in triton_cache.glob("*/*.ptx"):
        got[path.stem].append(normalised(path.read_text()))
    return {name: sorted(texts) for name, texts in got.items()}


def compile_jobs(tree: Path, cache: Path, only: str | None, workers: int) -> None:
    """Run `aot_check` on the checkout at `tree` into `cache` (raises on a failing compile)."""
    cmd = [sys.executable, "-m", "tests.kernels.aot_check", "--workers", str(workers), "--cache", str(cache)]
    if only:
        cmd += ["--only", only]
    # absolute, since the base side runs in another folder: both must import the same Triton
    extra = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), *extra]))
    subprocess.run(cmd, cwd=tree, env=env, check=True)


def compare(base: dict[str, list[str]], new: dict[str, list[str]]) -> list[tuple[str, int, int, bool]]:
    """(kernel, base specialisations, new specialisations, identical) for every kernel of either."""
    return [
        (n, len(base.get(n, [])), len(new.get(n, [])), base.get(n) == new.get(n)) for n in sorted(base | new)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="the git revision to compare the working tree with, e.g. main")
    ap.add_argument("--only", default=None, help="only the jobs whose name contains this text")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ptx_diff_") as tmp:
        tmp = Path(tmp)
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tmp / "base"), args.base], cwd=ROOT, check=True
        )
        try:
            compile_jobs(tmp / "base", tmp / "base_cache", args.only, args.workers)
            compile_jobs(ROOT, tmp / "new_cache", args.only, args.workers)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "base")], cwd=ROOT, check=False)
        caches = [next((tmp / c).glob("triton-*")) for c in ("base_cache", "new_cache")]
        rows = compare(*(ptx_by_kernel(c) for c in caches))
    for name, nb, nn, same in rows:
        print(f"{name:40s} base {nb:3d}  new {nn:3d}  {'identical' if same else 'DIFFERENT'}")
    differ = [r[0] for r in rows if not r[3]]
    print(
        f"{len(rows) - len(differ)} of {len(rows)} kernels identical"
        + (f"; differ: {differ}" if differ else "")
    )
    return 1 if differ or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
