"""sm_90 compile jobs of `simple_gla`'s chunked kernels (`common.aot`): with the scalar decay and
without (RetNet's fixed decay enters as g; linear attention has none), at the decay family's launch
shape (`decay.aot_jobs.DIMS`) and every autotune config."""

from __future__ import annotations

from lt2dsl.kernels.common.aot import Job
from lt2dsl.kernels.simple_gla.chunk import bwd_dqkg_kernel, o_dv_kernel

from ..decay.aot_jobs import DIMS, decay_jobs


def jobs() -> list[Job]:
    out = []
    for has_g in (True, False):
        cex = dict(DIMS, HAS_G=has_g, **({} if has_g else {"g": None}))
        tag = f"g{has_g:d}"
        out += decay_jobs(f"simple_gla/fwd_o-{tag}", o_dv_kernel, dict(cex, DV=False), fp32=("g",))
        out += decay_jobs(f"simple_gla/bwd_dv-{tag}", o_dv_kernel, dict(cex, DV=True), fp32=("g",))
        dg = {} if has_g else {"dg": None}
        out += decay_jobs(f"simple_gla/bwd_dqkg-{tag}", bwd_dqkg_kernel, dict(cex, **dg), fp32=("g", "dg"))
    return out
