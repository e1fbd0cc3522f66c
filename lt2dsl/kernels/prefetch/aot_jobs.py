"""sm_90 compile jobs of the L2 prefetch (`common.aot`): the prefetch kernel (its inline PTX is
assembled by ptxas here only: the interpreter cannot run it) and the plan kernel the CPU tests run."""

from __future__ import annotations

from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.prefetch import triton_prefetch as P


def jobs() -> list[Job]:
    cex = {"CHUNK": P.CHUNK, "BLOCK": P.BLOCK}
    out = tuned_jobs("prefetch/l2", P.l2_prefetch_kernel, {"base": "*u8"}, {"nbytes": "i64"}, cex,
                     launch=(4, 1), aligned=())  # fmt: skip
    out += tuned_jobs("prefetch/plan", P.plan_kernel, {"offsets": "*i64", "sizes": "*i32"}, {"nbytes": "i64"},
                      cex, launch=(4, 1), aligned=())  # fmt: skip
    return out
