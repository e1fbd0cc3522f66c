"""Every Triton kernel compiled for sm_90 with the GPU's Triton (`tests/kernels/aot_check.py`).

The CPU tests run Triton's interpreter, which accepts code the GPU's Triton rejects (a constexpr
helper parameter with a plain Python default: every delta-rule and decay kernel failed on the GPU
while the CPU suite passed). The check runs in a subprocess whose `import triton` finds the GPU's
Triton, from `--gpu-triton DIR` (`make test` passes the folder `make gpu-triton` fills with the
Makefile's GPU_TRITON); without the option the tests that need it are skipped.
"""

from __future__ import annotations

import textwrap

import pytest
import triton
import triton.language as tl

from lt2dsl.kernels.common import aot
from tests.kernels.aot_check import SMEM_LIMIT, problems, report
from tests.kernels.gpu_triton import ROOT, option_dir, python_with


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_at_every_config(gpu_triton, tmp_path):
    """Fails on a compile error (kernel, file and line), shared memory over the sm_90 limit, the
    pipelining hazard and a family's spill bound; results of passing jobs are cached in .tcache."""
    cache = ROOT / ".tcache" / "aot"
    args = ["--workers", "2", "--cache", str(cache), "--json", str(tmp_path / "aot.json")]
    out = python_with([gpu_triton], "-m", "tests.kernels.aot_check", *args, timeout=3000)
    print(out.stdout[-4000:])
    fails = [ln for ln in out.stdout.splitlines() if ln.startswith("FAIL")]
    assert out.returncode == 0, "\n".join(fails) or out.stderr[-4000:]


def test_every_kernel_has_a_compile_job(request):
    """Every `triton.jit` kernel reachable from `lt2dsl.kernels` (no device helper) is in a job;
    with the local Triton (interpreter off) when no --gpu-triton is given."""
    first = [p for p in [option_dir(request.config)] if p is not None]
    out = python_with(first, "-m", "tests.kernels.aot_check", "--list", timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "0 kernels without a job" in out.stdout


BROKEN = """
import triton
import triton.language as tl


@triton.jit
def load16(p, CACHE: tl.constexpr = ""):
    return tl.load(p + tl.arange(0, 16), cache_modifier=CACHE)


@triton.jit
def broken_kernel(x, y):
    tl.store(y + tl.arange(0, 16), load16(x))
"""

DRIVER = """
import broken
from lt2dsl.kernels.common.aot import tuned_jobs
from tests.kernels.aot_check import compile_job, describe_error

job = tuned_jobs("broken", broken.broken_kernel, {}, {}, {}, launch=(4, 1))[0]
try:
    compile_job(job)
    print("compiled")
except Exception as e:
    print(describe_error(e, [broken.load16, broken.broken_kernel]))
"""


def test_a_compile_error_names_the_kernel_and_its_line(gpu_triton, tmp_path):
    """The GPU's Triton rejects a helper's constexpr parameter with a plain Python default (the
    regression of issue 33); the check reports the kernel's file and the line of the call."""
    (tmp_path / "broken.py").write_text(textwrap.dedent(BROKEN))
    out = python_with([gpu_triton, tmp_path], "-c", DRIVER, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = 1 + BROKEN.splitlines().index("    tl.store(y + tl.arange(0, 16), load16(x))")
    assert f"broken.py:{line} (broken_kernel)" in out.stdout, out.stdout
    assert "'str' object has no attribute 'type'" in out.stdout, out.stdout


@triton.jit
def _helper(x):
    return x + 1


@triton.jit
def _combine(a, b):
    return a + b


@triton.jit
def _kernel(p):
    x = tl.load(p + tl.arange(0, 4))
    tl.store(p, tl.reduce(_helper(x), 0, _combine))


@triton.jit
def _orphan(p):
    tl.store(p, 0.0)


def test_kernels_are_the_jit_functions_no_other_one_names():
    """Called helpers and combine functions passed by name are not kernels; a kernel no job
    compiles is reported by module and name."""
    found = aot.kernels([_helper, _combine, _kernel, _orphan])
    assert found == [_kernel, _orphan]
    job = aot.Job("k", _kernel, {}, {}, 4, 1)
    assert aot.uncovered(found, [job]) == [f"{__name__}._orphan"]


def test_problems_name_each_limit_crossed():
    job = aot.Job("j", _kernel, {}, {}, 4, 2, max_stack=64)
    ok = {"shared": SMEM_LIMIT, "registers": 128, "stack": 64, "hazards": []}
    assert problems(job, ok) == []
    bad = {"shared": SMEM_LIMIT + 1, "registers": 255, "stack": 65, "hazards": [["%1", "2", "[1]"]]}
    found = problems(job, bad)
    assert len(found) == 3
    assert "shared memory" in found[0] and "pipelining race" in found[1] and "spills" in found[2]
    assert problems(aot.Job("j", _kernel, {}, {}, 4, 2), dict(ok, stack=10**6)) == []  # no bound set
    lines = report([job], {"j": {"error": "x.py:3 (k) -> boom"}}, ["m.k2"])
    assert lines[0].startswith("no compile job for kernel m.k2")
    assert "_kernel [j, 4 warps, 2 stages]: does not compile: x.py:3 (k) -> boom" in lines[1]
