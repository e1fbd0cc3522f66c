"""KDA: reference forms (CPU, float64) and the Triton kernels (interpreter on CPU, full size on GPU)."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.errors import OutOfResources

from lt2dsl.kernels.common.delta_launch import N_CONFIGS, forced_config
from tests.kernels.test_delta_family import OPS, chunk_ref, make_inputs, run_gpu_decode, run_gpu_suite
from tests.kernels.utils import assert_close

INFO = OPS["kda"]


@pytest.mark.parametrize("T", [63, 100])
def test_reference_strong_per_channel_decay(T):
    """Log decays down to ≈ −60 per step: a 64-chunk spans e^{−3000}; no exponent may be positive."""
    x = make_inputs("channel", B=1, T=T, H=1, HV=2, K=16, V=8, decay=30.0, seed=7)
    o, S = INFO.call_naive(x, initial_state=x["initial_state"], output_final_state=True)
    o2, S2 = chunk_ref(INFO, x, initial_state=x["initial_state"], output_final_state=True)
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
