"""sm_90 compile jobs of the delta-rule family (DeltaNet, GDN, KDA; `common.aot`).

The kernel forms of every recipe the kernels have for each gate (`recipe.every_recipe`: the fused
scan or the split form, each key tile of the gradient kernel), at K = V = 128, H = HV = 16, bf16
inputs; each at every config of its autotuner (or the launch's fixed one). `jobs(dtype)` builds
the same jobs for other input dtypes. Spills are bounded at MAX_STACK bytes per thread.
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.delta import configs
from lt2dsl.kernels.delta import launch as L
from lt2dsl.kernels.delta.gates import GATE_RAW
from lt2dsl.kernels.delta.grad import delta_grad_final_kernel
from lt2dsl.kernels.delta.kda_grad import kda_grad_intra_kernel
from lt2dsl.kernels.delta.launch_bwd import KDA_BK, KDA_WARPS, TRITON_DT
from lt2dsl.kernels.delta.recipe import GATES, DeltaRecipe, every_recipe
from lt2dsl.kernels.delta.recurrent import delta_recurrent_kernel

MAX_STACK = 512  # bytes of per-thread stack (spills) tolerated at bf16
D = 128
SCALARS = {"T": "i32", "R": "i32", "NC": "i32", "scale": "fp32", "s_ab": "i32", "beta_scale": "fp32"}
INDEX = {"cu_seqlens": "*i64", "chunk_indices": "*i32", "chunk_offsets": "*i32"}
# buffers in the input dtype; every other pointer is fp32 (gates, T, scores, scratch, states)
INPUT_DTYPE = ("q", "k", "v", "beta", "o", "h", "vnew", "do", "dv", "dh", "w")


class _Family:
    """The job builders at one input dtype."""

    def __init__(self, dtype: torch.dtype):
        p = "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
        self.dtype = dtype
        self.ptrs = {**dict.fromkeys(INPUT_DTYPE, p), **INDEX}
        self.base = dict(H=16, HV=16, K=D, BT=L.BT, IS_VARLEN=False, DOT=L.dot_mode(dtype))
        self.scan = dict(self.base, V=D, BK=L.state_bk(D), PREC=L.split_mode(dtype))

    def jobs(self, name, tuned, cex, launch=None) -> list[Job]:
        return tuned_jobs(
            name, tuned, self.ptrs, SCALARS, cex, launch=launch, aligned=("T", "R"), max_stack=MAX_STACK
        )

    def forward(self, gate: str, recipe: DeltaRecipe) -> list[Job]:
        """The preparation and the forward scan of `recipe` (split-form kernels by their GATE)."""
        g = L.GATE_IDS[gate]
        if gate == "channel":
            kda = dict(self.base, SPAN=recipe.kda_diag_span)
            jobs = [j for part in (1, 2) for j in self.jobs(f"delta/kda_prep-p{part}", configs.kda_prep,
                                                             dict(kda, PART=part))]  # fmt: skip
        else:
            cex = dict(self.base, BK=D, USE_G=gate == "scalar")
            jobs = self.jobs(f"delta/wy-g{g}", configs.wy_rows, cex)
        ends = dict(self.scan, USE_H0=True, STORE_FINAL=True)
        if recipe.fused_scan:
            for save in (False, True):
                cex = dict(ends, GATE=g, SAVE=save)
                jobs += self.jobs(f"delta/scan_fused-g{g}-save{save:d}", configs.hot_fwd, cex)
            return jobs
        sg = L.state_gate(gate)
        jobs += self.jobs(f"delta/scan-g{sg}", configs.h_fwd, dict(ends, GATE=sg, STORE_VNEW=True))
        return jobs + self.jobs(f"delta/output-g{sg}", configs.o_fwd, dict(self.scan, GATE=sg))

    def backward(self, gate: str, recipe: DeltaRecipe) -> list[Job]:
        """The reverse scan's passes and the per-chunk gradient kernels at the recipe's key tile."""
        g, sg = L.GATE_IDS[gate], L.state_gate(gate)
        cex = dict(self.scan, GATE=sg)
        jobs = self.jobs(f"delta/pdo-g{sg}", configs.du0, cex)
        jobs += self.jobs(f"delta/w-g{sg}", configs.w_bwd, {n: v for n, v in cex.items() if n != "V"})
        d16 = gate == "none" and L.split_mode(self.dtype)
        scan = dict(self.scan, GATE=g if gate == "none" else sg, D16=d16, USE_DHT=True, STORE_DH0=True)
        jobs += self.jobs(f"delta/scan_bwd-g{scan['GATE']}", configs.dh_bwd, scan)
        y = dict(HV=16, V=D, BT=L.BT, IS_VARLEN=False, DOT=self.base["DOT"], PREC=self.scan["PREC"],
                 DT=TRITON_DT[self.dtype])  # fmt: skip
        jobs += self.jobs("delta/y", configs.y_bwd, y)
        jobs += self.jobs(f"delta/grad_cc-g{g}", configs.grad_cc, dict(self.scan, BK=D, GATE=g))
        bk = recipe.grad_bk
        jobs += self.jobs(f"delta/grad_k-g{g}-bk{bk}", configs.grad_k[bk], dict(self.scan, BK=bk, GATE=g))
        if gate == "channel":
            kda = dict(self.base, BK=KDA_BK, SPAN=recipe.kda_diag_span)
            return jobs + self.jobs("delta/kda_grad", kda_grad_intra_kernel, kda, launch=(KDA_WARPS, 1))
        fin = dict(HV=16, K=D, BT=L.BT, NK=D // bk, GATE=g, IS_VARLEN=False)
        # launched without options: Triton's default 4 warps, 3 stages
        return jobs + self.jobs(f"delta/grad_final-g{g}-bk{bk}", delta_grad_final_kernel, fin, launch=(4, 3))

    def recurrent(self, gate: str) -> list[Job]:
        cex = dict(H=16, HV=16, K=D, V=D, BK=L.pow2(D), BV=min(32, L.pow2(D)), GATE=L.GATE_IDS[gate],
                   USE_H0=True, STORE_FINAL=True, L2NORM=True, IS_VARLEN=False)  # fmt: skip
        # `ops._recurrent`: 4 warps up to K = 128, Triton's default 3 stages
        return self.jobs(f"delta/recurrent-g{cex['GATE']}", delta_recurrent_kernel, cex, launch=(4, 3))

    def recurrent_raw_gates(self) -> list[Job]:
        """GDN's decode with the raw gate projections a, b (GATE 3, `gates.py`): q, k already
        normalised by the conv kernel, a and b in the input dtype, A_log and dt_bias fp32."""
        cex = dict(H=16, HV=16, K=D, V=D, BK=L.pow2(D), BV=min(32, L.pow2(D)), GATE=GATE_RAW, USE_H0=True,
                   STORE_FINAL=True, L2NORM=False, IS_VARLEN=False)  # fmt: skip
        ptrs = {**self.ptrs, "g": self.ptrs["beta"]}
        return tuned_jobs("delta/recurrent-g3", delta_recurrent_kernel, ptrs, SCALARS, cex, launch=(4, 3),
                          aligned=("T",), max_stack=MAX_STACK)  # fmt: skip


def jobs(dtype: torch.dtype = torch.bfloat16) -> list[Job]:
    """Every kernel form of every recipe, once, at inputs of `dtype`."""
    fam = _Family(dtype)
    out: dict[str, Job] = {}
    for gate in GATES:
        for recipe in every_recipe(gate):
            for job in fam.forward(gate, recipe) + fam.backward(gate, recipe):
                out.setdefault(job.name, job)
        for job in fam.recurrent(gate):
            out.setdefault(job.name, job)
    for job in fam.recurrent_raw_gates():
        out.setdefault(job.name, job)
    return list(out.values())
