"""The GPU's Triton for tests that compile for sm_90: a `pip --target` folder (`--gpu-triton DIR`,
which `make test` passes) put first on a subprocess's import path, the interpreter off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def option_dir(config) -> Path | None:
    """The `--gpu-triton` folder, None without the option; a folder without Triton is an error."""
    import pytest

    opt = config.getoption("--gpu-triton")
    if opt is None:
        return None
    path = Path(opt).resolve()
    if not (path / "triton" / "__init__.py").exists():
        pytest.fail(f"--gpu-triton {opt}: no Triton there (`make gpu-triton` installs it)")
    return path


def python_with(first: list[Path], *args: str, timeout: int) -> subprocess.CompletedProcess:
    """`python *args` at the repo root with the interpreter off and the folders `first` (the GPU's
    Triton) first on the import path."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, first), str(ROOT)])
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
