"""Fixtures of the kernel tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernels.gpu_triton import option_dir


@pytest.fixture
def gpu_triton(request) -> Path:
    """The GPU's Triton folder (`--gpu-triton DIR`); the test is skipped without the option."""
    path = option_dir(request.config)
    if path is None:
        pytest.skip("compiling for sm_90 needs --gpu-triton DIR (make test passes it)")
    return path


@pytest.fixture
def poison(monkeypatch):
    """Every buffer a Triton launcher allocates starts as NaN (`LT2_POISON=1`), so an element a kernel
    forgets to write fails the comparison instead of passing on leftover memory."""
    monkeypatch.setenv("LT2_POISON", "1")
