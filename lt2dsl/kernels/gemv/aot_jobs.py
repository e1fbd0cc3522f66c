"""sm_90 compile jobs of the decode GEMV (`common.aot`): every autotune config of `gemv_kernel`
its pruner keeps in each of the forms the decode rules launch (a 2048-wide model with a 5632-wide
SwiGLU MLP, the hybrid example's; bf16): the in-projection with the RMSNorm prologue, the gate/up projection
with the RMSNorm prologue and the SwiGLU epilogue, the o_proj / down projection with the residual
epilogue, the plain product, and a sandwich block's in- and gate/up projections with the
norm-add-norm prologue, and GDN's o_proj with the gated-norm prologue and the residual epilogue."""

from __future__ import annotations

from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.gemv import triton_gemv as G

DIM, HIDDEN = 2048, 5632
SCALARS = {n: "i32" for n in ("M", "N", "K", "sx", "sw", "sy", "sr", "sxr", "ss_", "up", "nwd")}
SCALARS |= {"eps": "fp32", "eps1": "fp32"}
# (tag, prologue, epilogue, N, K): the output width and reduction the pruner sees (the deep
# configs are kept for narrow outputs only)
FORMS = (
    ("norm", "rmsnorm", None, 6 * DIM, DIM),
    ("norm-swiglu", "rmsnorm", "swiglu", HIDDEN, DIM),
    ("residual", None, "residual", DIM, HIDDEN),
    ("plain", None, None, DIM, 2 * DIM),
    ("sandwich", "norm-add-rmsnorm", None, 6 * DIM, DIM),
    ("sandwich-swiglu", "norm-add-rmsnorm", "swiglu", HIDDEN, DIM),
    ("gated-residual", "gated-rmsnorm", "residual", DIM, 2 * DIM),
)
GROUP = 256  # the gated norm's group: the hybrid's GDN value head (head_dim 128, expand_v 2)


def jobs() -> list[Job]:
    out = []
    for tag, pro, epi, N, K in FORMS:
        cex = {"BM": G.BM, "PRO": G.PRO_CODES[pro], "EPI": G.EPI_CODES[epi]}
        cex |= {"GROUP": GROUP} if pro == "gated-rmsnorm" else {}
        out += tuned_jobs(
            f"gemv/{tag}", G.gemv_kernel, {}, SCALARS, cex, values={"N": N, "K": K}, aligned=("K", "sw"),
            default_ptr="*bf16",
        )  # fmt: skip
    return out
