"""sm_90 compile jobs of the two-launch GDN decode step (`gdn_step`, `common.aot`): bf16 inputs,
the fp32 state, convs of width 4 without bias, at the hybrid example's heads (16 of K = 128,
V = 256) and the 12-layer GDN model's (K = V = 128), 4 warps as the launch code uses."""

from __future__ import annotations

from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.delta import gdn_step as G

SHAPES = {"hybrid": (16, 16, 128, 256), "gdn12": (8, 8, 128, 128)}  # (H, HV, K, V)


def jobs() -> list[Job]:
    out = []
    for tag, (H, HV, K, V) in SHAPES.items():
        rec_ptrs = {n: "*bf16" for n in ("XQ", "XK", "XV", "XA", "XB", "HQ", "HK", "HVH", "WQ", "WK", "WV")}
        rec_ptrs |= {"BQ": "*bf16", "BK_": "*bf16", "BV_": "*bf16", "A_log": "*fp32", "dt_bias": "*fp32"}
        rec_ptrs |= {"S": "*fp32", "O": "*bf16"}
        strides = ("sxq", "sxk", "sxv", "sab", "shq", "shk", "shv", "shqc", "shkc", "shvc")
        scalars = dict.fromkeys(strides, "i32")
        scalars |= {"scale": "fp32", "beta_scale": "fp32"}
        cex = dict(H=H, HV=HV, K=K, V=V, BK=K, BV=32, W=4, WP=4, HAS_BQ=False, HAS_BK=False, HAS_BV=False)
        out += tuned_jobs(f"gdn_step/recurrent-{tag}", G.gdn_step_recurrent_kernel, rec_ptrs, scalars, cex,
                          launch=(4, 1), aligned=())  # fmt: skip
        norm_ptrs = {n: "*bf16" for n in ("O", "XZ", "GAMMA", "OUT", "XQ", "XK", "HQ", "HK")}
        nscalars = {n: "i32" for n in ("sxz", "sxq", "sxk", "shq", "shk", "shqc", "shkc")} | {"eps": "fp32"}
        ncex = dict(H=H, HV=HV, K=K, V=V, BK=K, BVF=V, W=4, WP=4)
        out += tuned_jobs(f"gdn_step/norm-{tag}", G.gdn_step_norm_kernel, norm_ptrs, nscalars, ncex,
                          launch=(4, 1), aligned=())  # fmt: skip
    return out
