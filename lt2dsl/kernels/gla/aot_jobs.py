"""sm_90 compile jobs of `gla`'s chunked kernels (`common.aot`): per-channel decay at the decay
family's launch shape (`decay.aot_jobs.DIMS`), every autotune config; the intra-chunk kernels at
the diagonal span of 16-bit (bf16) inputs."""

from __future__ import annotations

from lt2dsl.kernels.common.aot import Job
from lt2dsl.kernels.common.tl_util import diag_span
from lt2dsl.kernels.gla import chunk as C

from ..decay.aot_jobs import DIMS, decay_jobs

FP32 = ("g", "A", "dA", "dq_in", "dk_in", "dg")


def jobs() -> list[Job]:
    intra = dict(DIMS, BC=C.BC, SPAN=diag_span(False))
    out = decay_jobs("gla/intra_A", C.intra_A_kernel, intra, fp32=FP32)
    out += decay_jobs("gla/bwd_dqk_intra", C.bwd_dqk_intra_kernel, intra, fp32=FP32)
    out += decay_jobs("gla/fwd_o", C.o_dv_kernel, dict(DIMS, DV=False), fp32=FP32)
    out += decay_jobs("gla/bwd_dv", C.o_dv_kernel, dict(DIMS, DV=True), fp32=FP32)
    for name in ("bwd_dA", "bwd_dqkg"):
        out += decay_jobs(f"gla/{name}", getattr(C, f"{name}_kernel"), DIMS, fp32=FP32)
    return out
