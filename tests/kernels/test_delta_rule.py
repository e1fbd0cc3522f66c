"""DeltaNet: reference forms (CPU, float64) and the Triton kernels (interpreter on CPU, full size on GPU)."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.errors import OutOfResources

from lt2dsl.kernels.common.delta_launch import N_CONFIGS, forced_config
from tests.kernels.test_delta_family import OPS, chunk_ref, make_inputs, run_gpu_decode, run_gpu_suite
from tests.kernels.utils import assert_close

INFO = OPS["delta_rule"]


def test_reference_reflections():
    """β up to 2 (allow_neg_eigval: I − 2kkᵀ is a reflection) with unit keys stays bounded and exact."""
    x = make_inputs("none", B=1, T=100, H=1, HV=2, K=16, V=8, seed=2)
    x["beta"] = x["beta"] * 2
    o, S = INFO.call_naive(x, initial_state=x["initial_state"], output_final_state=True)
    o2, S2 = chunk_ref(INFO, x, initial_state=x["initial_state"], output_final_state=True)
    assert torch.isfinite(o).all()
    assert_close("o", o2, o, 1e-10)
    assert_close("S", S2, S, 1e-10)


GPU_CASES = ["T1000-D64", "T1000-D128", "T8192-D64", "T8192-D128", "gva", "odd", "varlen"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_matches_reference(case, dtype):
    """Full sizes on the GPU: o, final state and every gradient against float64."""
    run_gpu_suite(INFO, case, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_gpu_decode(batch):
    run_gpu_decode(INFO, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("config", range(N_CONFIGS))
def test_gpu_every_autotune_config(config, dtype):
    """Each config an autotuned kernel may pick on this GPU, forced one at a time.

    A config that does not fit the GPU (OutOfResources) is never picked by the autotuner: skipped.
    """
    with forced_config(config):
        try:
            run_gpu_suite(INFO, "T1000-D128", dtype)
        except OutOfResources as e:
            pytest.skip(f"config {config} does not fit: {e}")
