"""`lt2dsl.env`, the one module that reads the environment, and the kernel pieces it drives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from lt2dsl import env
from lt2dsl.kernels.common.backend import TRITON_DTYPES, check_triton_dtype, new_empty

ROOT = Path(__file__).parents[1]


def test_debug_level_reads_the_variable_at_each_call(monkeypatch):
    monkeypatch.delenv("LT2_DEBUG", raising=False)
    assert env.debug_level() == 0
    monkeypatch.setenv("LT2_DEBUG", "2")
    assert env.debug_level() == 2
    monkeypatch.setenv("LT2_DEBUG", "yes")
    assert env.debug_level() == 1


def test_poisoned_buffers_are_nan_and_plain_ones_are_not_touched(monkeypatch):
    like = torch.zeros(2, dtype=torch.bfloat16)
    monkeypatch.setenv("LT2_POISON", "1")
    buf = new_empty(like, 3, 4, dtype=torch.float32)
    assert buf.shape == (3, 4) and buf.dtype == torch.float32 and buf.isnan().all()
    assert new_empty(like, 5).dtype == torch.bfloat16 and new_empty(like, 5).isnan().all()
    assert new_empty(like, 2, dtype=torch.int32).dtype == torch.int32
    monkeypatch.setenv("LT2_POISON", "0")
    assert not env.poison()


def test_the_triton_dtypes_are_the_setting_dtypes_of_the_one_table():
    assert (torch.float32, torch.bfloat16, torch.float16) == TRITON_DTYPES
    check_triton_dtype(torch.zeros(1, dtype=torch.bfloat16), None, torch.zeros(1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float64"):
        check_triton_dtype(torch.zeros(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="one dtype"):
        check_triton_dtype(torch.zeros(1), torch.zeros(1, dtype=torch.float16))


def test_only_the_env_module_reads_the_environment():
    readers = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "lt2dsl").rglob("*.py")
        if re.search(r"os\.environ|os\.getenv", p.read_text(encoding="utf-8"))
    )
    assert readers == ["lt2dsl/env.py"], readers
