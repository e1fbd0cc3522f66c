"""sm_90 compile jobs of the indexer's fused KL (`triton_loss`), at its fixed launch (64 slots a chunk,
4 warps, 2 stages): the distillation shape (12 query heads on 4 kv heads of 64, 4 index heads of 64)
and a V3.2-like one (16 query heads on one kv head of 128, 64 index heads of 128); main keys bf16 or
fp32, index projections bf16 or fp32 (fp32 when a LayerNorm's fp32 index keys promote them under
autocast)."""

from __future__ import annotations

import torch
import triton

from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.common.attn_triton import dot_precision, pow2
from lt2dsl.kernels.dsa.triton_loss import _kl_bwd_kernel, _kl_fwd_kernel, grad_precision, launch

MAX_STACK = 512
SCALARS = {**{n: "i32" for n in ("Tq", "Tk", "NIDX", "NROWS")}, "scale": "fp32", "idx_scale": "fp32"}
ALIGNED = ("NIDX",)
SHAPES = {  # HQ, HKV, D, HI, DI
    "distill": (12, 4, 64, 4, 64),
    "v32": (16, 1, 128, 64, 128),
}
TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}


def _launch(HI: int, DI: int, index: torch.dtype) -> dict:
    cfg = launch(HI, DI, index)
    return dict(launch=(cfg["num_warps"], cfg["num_stages"]), aligned=ALIGNED, max_stack=MAX_STACK)


def _fwd(shape: str, main: torch.dtype, index: torch.dtype) -> list[Job]:
    HQ, HKV, D, HI, DI = SHAPES[shape]
    ptrs = {"Q": TYPES[main], "K": TYPES[main], "QI": TYPES[index], "KI": TYPES[index], "WI": "*bf16"}
    ptrs |= {"IDX": "*i64", "START": "*i64", "KL": "*fp32", "P": "*fp32", "STATS": "*fp32"}
    G = HQ // HKV
    cex = dict(HQ=HQ, GRP=G, D=D, BD=pow2(D), BR=pow2(G), BKV=triton.next_power_of_2(HKV), HI=HI, DI=DI)
    cex |= dict(BDI=pow2(DI), BHI=pow2(HI), BK=launch(HI, DI, index)["BK"])
    cex |= dict(DOT_PREC=dot_precision(main), IDX_PREC=dot_precision(index))
    name = f"dsa/kl_fwd-{shape}-{TYPES[main][1:]}-{TYPES[index][1:]}"
    return tuned_jobs(name, _kl_fwd_kernel, ptrs, SCALARS, cex, **_launch(HI, DI, index))


def _bwd(shape: str, index: torch.dtype) -> list[Job]:
    _, _, _, HI, DI = SHAPES[shape]
    ptrs = {"QI": TYPES[index], "KI": TYPES[index], "WI": "*bf16", "IDX": "*i64", "START": "*i64"}
    ptrs |= {"P": "*fp32", "STATS": "*fp32", "DKL": "*fp32", "DQI": TYPES[index], "DKI": "*fp32"}
    ptrs |= {"DWI": "*bf16"}
    cex = dict(HI=HI, DI=DI, BDI=pow2(DI), BHI=pow2(HI), BK=launch(HI, DI, index)["BK"])
    cex |= dict(IDX_PREC=dot_precision(index), GRAD_PREC=grad_precision(index))
    name = f"dsa/kl_bwd-{shape}-{TYPES[index][1:]}"
    return tuned_jobs(name, _kl_bwd_kernel, ptrs, SCALARS, cex, **_launch(HI, DI, index))


def jobs() -> list[Job]:
    out = []
    for shape in SHAPES:
        for main, index in ((torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)):
            out += _fwd(shape, main, index)
        out += _bwd(shape, torch.bfloat16) + _bwd(shape, torch.float32)
    return out + _fwd("distill", torch.float32, torch.float32)
