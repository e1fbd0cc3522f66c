"""Compile the mLSTM kernels for sm_90 (H200) without a GPU, at both autotune configs.

Registers decide how many programs share an SM (the sixth session cut the output and dv kernels
from 219 to 166 / 164 registers per thread at 4 warps, three programs per SM as `simple_gla`'s);
this prints each kernel's shared memory, registers and stack and asserts small spills. Runs only
with LT2_AOT_CHECK=1, in its own pytest process; no device is used:

    LT2_AOT_CHECK=1 TRITON_DEFAULT_FP_FUSION=1 python -m pytest -q -s tests/kernels/test_mlstm_compile.py
"""

from __future__ import annotations

import os

import pytest

from tests.kernels.test_delta_compile import MAX_STACK, SMEM_LIMIT, _compile

pytestmark = pytest.mark.skipif(
    os.environ.get("LT2_AOT_CHECK") != "1", reason="offline sm_90 compile check: set LT2_AOT_CHECK=1"
)

BF16 = {"q", "k", "v", "Cs", "dnum", "dCs", "dv", "dq", "dk", "o", "do", "ds_scr"}


def _jobs():
    if os.environ.get("LT2_AOT_CHECK") != "1":
        return []
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.runtime.autotuner import Autotuner

    from lt2dsl.kernels.mlstm import chunk, chunk_bwd, stabiliser_triton

    def unwrap(k):  # an autotuned kernel's JIT function
        return k.fn if isinstance(k, Autotuner) else k

    base = dict(H=16, K=128, V=128, BT=64, BK=64, BV=64, IS_VARLEN=False, PREC="tf32", HAS_H0=True)
    base.update(HAS_DHT=True, STORE_DH0=True, BC=64, NK=2, BL=1024, HAS_M0=True, HAS_DMT=True)
    kernels = {
        "state": chunk.fwd_state_kernel,
        "dh-weights": chunk_bwd.bwd_weights_kernel,
        "stab": chunk.fwd_stab_kernel,
        "output": chunk.fwd_o_kernel,
        "dh": chunk_bwd.bwd_dh_kernel,
        "dv": chunk_bwd.bwd_dv_kernel,
        "dqk": chunk_bwd.bwd_dqk_kernel,
        "route": stabiliser_triton.route_kernel,
    }
    tuned = [(c.num_warps, c.num_stages) for c in chunk._CONFIGS]
    jobs = []
    for name, kernel in kernels.items():
        fn = unwrap(kernel)
        cex = {n: v for n, v in base.items() if n in fn.arg_names}
        configs = [(4, 1)] if name in ("stab", "route", "dh-weights") else tuned
        if name == "output":
            configs = [(c.num_warps, c.num_stages) for c in chunk._O_CONFIGS]
        if name == "dqk":  # 128-wide key tiles at K = 128, at its one config
            cex, configs = dict(cex, BK=128), [(8, 3)]
        jobs += [(f"{name}-w{w}s{s}", fn, cex, w, s) for w, s in configs]
    return jobs


JOBS = _jobs()


@pytest.mark.parametrize("job", JOBS, ids=[j[0] for j in JOBS])
def test_kernel_compiles_and_fits(job):
    name, fn, cex, warps, stages = job
    ptrs = {n: ("*bf16" if n in BF16 else "*fp32") for n in fn.arg_names}
    ptrs.update(R="*fp64", cu_seqlens="*i32", chunk_idx="*i32", chunk_offsets="*i32")
    scalars = {"T": "i32", "NTOT": "i32", "scale": "fp32", "eps": "fp32"}
    smem, regs, stack = _compile(fn, ptrs, scalars, cex, warps, stages)
    print(f"{name}: {smem} B shared, {regs} registers, {stack} B stack")
    assert smem <= SMEM_LIMIT
    assert stack <= MAX_STACK
