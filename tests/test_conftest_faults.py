"""tests/conftest.py's CUDA-fault hook: a test that breaks the CUDA context costs one xdist worker,
not every later test of that worker (what hid the real failures in the first H200 runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

FAULTY = """
def test_fault():
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_other_failure():
    assert 1 == 2


def test_after_1():
    pass


def test_after_2():
    pass


def test_after_3():
    pass
"""


def _run(tmp_path: Path, *args: str, env: dict | None = None) -> str:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_faulty.py").write_text(FAULTY)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(tmp_path)]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=None if env is None else {**os.environ, **env},
    )
    return out.stdout + out.stderr


def test_xdist_worker_restarts_after_a_cuda_fault(tmp_path):
    out = _run(tmp_path, "-n", "2")
    assert "CUDA context broken by" in out and "crashed while running" in out
    # every other test still ran in a healthy worker: the ordinary failure stays an ordinary one
    assert "3 passed" in out and "test_other_failure - assert 1 == 2" in out


def test_plain_run_stops_with_a_message(tmp_path):
    out = _run(tmp_path, "-p", "no:xdist")
    assert "CUDA context broken by test_faulty.py::test_fault" in out


def test_failure_reasons_are_logged_as_they_happen(tmp_path):
    """LT2_FAIL_LOG gets each failure's error lines once (from the xdist controller, not the
    workers): a GPU run cut by its time limit keeps the reasons pytest would print at the end."""
    log = tmp_path / "failures.log"
    _run(tmp_path, "-n", "2", env={"LT2_FAIL_LOG": str(log)})
    text = log.read_text()
    assert text.count("== test_faulty.py::test_other_failure (call)") == 1
    assert "E       assert 1 == 2" in text
    assert "test_after_1" not in text  # passing tests are not logged
