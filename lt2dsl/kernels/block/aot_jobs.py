"""sm_90 compile jobs of the persistent GDN block decode kernel (`common.aot`): the hybrid
example's block (16 heads of K = 128, V = 256, convs of width 4 without bias; bf16, fp32 state
and gates) and the 12-layer GDN model's heads (K = V = 128), every PHASE (0: all six through the
grid barriers; 1-6 one each) at each of the launch code's configs (`block.CONFIGS`)."""

from __future__ import annotations

import itertools

from lt2dsl.kernels import block as B
from lt2dsl.kernels.block import triton_gdn_block as G
from lt2dsl.kernels.common.aot import Job, tuned_jobs

SHAPES = {"hybrid": (16, 16, 128, 256), "gdn12": (8, 8, 128, 128)}  # (H, HV, K, V)
INTS = ("M", "D", "NIN", "HID", "sxn", "sres", "q_off", "k_off", "v_off", "z_off", "a_off", "b_off")
INTS += ("shq", "shk", "shv", "shqc", "shkc", "shvc")


def jobs() -> list[Job]:
    out = []
    ptrs = {"A_log": "*fp32", "dt_bias": "*fp32", "S": "*fp32", "BAR": "*i64"}
    scalars = dict.fromkeys(INTS, "i32") | dict.fromkeys(("scale", "beta_scale", "eps_o", "eps2"), "fp32")
    for (tag, (H, HV, K, V)), (i, cfg) in itertools.product(SHAPES.items(), enumerate(B.CONFIGS)):
        for phase in range(7):
            cex = dict(PHASE=phase, H=H, HV=HV, K=K, V=V, BKH=K, BV=32, BVF=V, W=4, WP=4, HAS_BQ=False,
                       HAS_BK=False, HAS_BV=False, BM=B.MAX_M, **B.kernel_tiles(cfg))  # fmt: skip
            name = f"gdn_block/{tag}-config{i}-phase{phase}"
            launch = (B.WARPS, B.STAGES)
            out += tuned_jobs(name, G.gdn_block_kernel, ptrs, scalars, cex, launch=launch, aligned=(),
                              default_ptr="*bf16")  # fmt: skip
    return out
