"""`lt2dsl.dtypes`: the one dtype table agrees with torch, and unresolved dtypes follow the model."""

import pytest
import torch

from lt2dsl import dtypes
from lt2dsl.dtypes import Dtypes, lookup, nbytes, torch_dtype


@pytest.mark.parametrize("name", list(dtypes.TABLE))
def test_sizes_are_torchs(name):
    entry = lookup(name)
    assert getattr(torch, entry.torch_name).itemsize == entry.nbytes == nbytes(name)
    for alias in entry.aliases:
        assert lookup(alias) is entry


def test_torch_dtype_takes_names_aliases_and_dtypes():
    assert torch_dtype("bf16") is torch_dtype("bfloat16") is torch.bfloat16
    assert torch_dtype("fp64") is torch.float64 and torch_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="must be one of fp32, float32, bf16"):
        torch_dtype("fp8")
    with pytest.raises(ValueError, match="floating-point"):
        torch_dtype(torch.int32)


def test_roles_choose_who_accepts_a_name():
    assert dtypes.SETTING_DTYPES == ("fp32", "bf16", "fp16")
    assert "fp8" in dtypes.ESTIMATE_DTYPES and "fp64" not in dtypes.ESTIMATE_DTYPES
    assert "fp64" in dtypes.LOWERING_DTYPES and "fp8" not in dtypes.LOWERING_DTYPES


def test_unresolved_dtypes_follow_the_model():
    assert Dtypes().resolve("fp32", "bf16") == Dtypes(act="fp32", state="bf16", kv="fp32")
    assert Dtypes(act="fp16").resolve("fp32", "fp32") == Dtypes(act="fp16", state="fp32", kv="fp16")
    assert Dtypes(kv="fp8").resolve("bf16", "fp32").nbytes("kv") == 1
    with pytest.raises(ValueError, match="not resolved"):
        Dtypes().nbytes("act")
