"""Compile the attention kernels for sm_90 (H200) without a GPU, at every config they may run with.

The interpreter cannot tell whether a config fits: this runs Triton's real pipeline down to a cubin
for the forward (its fixed bf16 tiles at D = 64 and 128) and the dK/dV and dQ kernels at each
autotune config (bf16, D = 128, causal, elementwise gate), asserting shared memory within Hopper's
per-block limit (or a clean OutOfResources, which the autotuner skips) and small register spills.
Runs only with LT2_AOT_CHECK=1, in its own pytest process; no device is used:

    LT2_AOT_CHECK=1 TRITON_DEFAULT_FP_FUSION=1 python -m pytest -q -s tests/kernels/test_attention_compile.py
"""

from __future__ import annotations

import os

import pytest

from tests.kernels.test_delta_compile import MAX_STACK, SMEM_LIMIT, _compile

pytestmark = pytest.mark.skipif(
    os.environ.get("LT2_AOT_CHECK") != "1", reason="offline sm_90 compile check: set LT2_AOT_CHECK=1"
)

INTS = {"Tq", "Tk", "qoff", "W", "KOFF", "NROWS", "BH0"}


def _jobs():
    if os.environ.get("LT2_AOT_CHECK") != "1":
        return []
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from lt2dsl.kernels.attention import triton_bwd as B
    from lt2dsl.kernels.attention import triton_fwd as F

    common = dict(HQ=16, GRP=1, D=128, DV=128, BD=128, BDV=128, CAUSAL=True, HAS_W=False, KSTRIDE=1)
    common.update(VARLEN=False, DOT_PREC="tf32")
    jobs = []
    for D in (64, 128):
        c = F.fwd_config(D, torch.bfloat16)
        for early in (True, False):
            cex = dict(common, D=D, DV=D, BD=D, BDV=D, GATE_MODE=1, ORDER=1, BM=c["BM"], BN=c["BN"])
            cex["GATE_EARLY"] = early
            name = f"fwd-D{D}" + ("" if early else "-gate-late")
            jobs.append((name, F._attn_fwd_kernel, cex, c["num_warps"], c["num_stages"]))
    for name, kernel, configs, order, extra in (
        ("dkdv", B._bwd_dkdv_kernel, B.KV_CONFIGS, 0, dict(STORE_DS=False)),
        ("dkdv-ds", B._bwd_dkdv_kernel, B.KV_DS_CONFIGS, 0, dict(STORE_DS=True)),
        ("dq", B._bwd_dq_kernel, B.Q_CONFIGS, 1, {}),
    ):
        for i, c in enumerate(configs):
            cex = dict(common, ORDER=order, **extra, **c.kwargs)
            jobs.append((f"{name}{i}", kernel, cex, c.num_warps, c.num_stages))
    ds_common = {n: common[n] for n in ("HQ", "GRP", "D", "BD", "CAUSAL", "DOT_PREC")}
    for i, c in enumerate(B.DS_CONFIGS):
        cex = dict(ds_common, ORDER=1, **c.kwargs)
        jobs.append((f"dq-ds{i}", B._bwd_dq_ds_kernel, cex, c.num_warps, c.num_stages))
    return jobs


JOBS = _jobs()


# Spills tolerated with the lengths unaligned (T = 1000): the dS store's 128 x 64 2-stage tile
# spills 536 B there (272 B aligned), and the tuner keeps it for the aligned training shapes,
# where it is the H200's fastest (seventeenth session). Spills cost speed, not correctness.
UNALIGNED_STACK = 640


@pytest.mark.parametrize("aligned", [True, False], ids=["T%16", "T-odd"])
@pytest.mark.parametrize("job", JOBS, ids=[j[0] for j in JOBS])
def test_config_compiles_and_fits(job, aligned):
    """With the lengths divisible by 16 (as the JIT specialises T = 8192) and without."""
    from triton.runtime.errors import OutOfResources

    name, fn, cex, warps, stages = job
    ptrs = {n: "*bf16" for n in ("Q", "K", "V", "GATE", "O", "DU", "DQ", "DK", "DV_OUT", "DS")}
    ptrs.update(LSE="*fp32", DELTA="*fp32", CU_Q="*i32", CU_K="*i32", BLK_MAP="*i32")
    scalars = {n: "i32" for n in INTS}
    scalars.update(qk_scale="fp32", scale="fp32")
    try:
        lengths = ("Tq", "Tk", "NROWS") if aligned else ()
        smem, regs, stack = _compile(fn, ptrs, scalars, cex, warps, stages, aligned=lengths)
    except OutOfResources as e:  # the autotuner skips such a config on the GPU
        pytest.skip(f"{name}: {e}")
    print(f"{name} aligned={aligned}: {smem} B shared, {regs} registers, {stack} B stack")
    if smem > SMEM_LIMIT:
        pytest.skip(f"{name}: {smem} B of shared memory does not fit; the autotuner skips it")
    assert stack <= (MAX_STACK if aligned else UNALIGNED_STACK)
