"""sm_90 compile jobs of the softmax attention kernels (`common.aot`).

bf16 (the autotuned path) at head dims 64 and 128 for the forward, 128 for the backward: causal
with an elementwise output gate (the `full(gate=sdpa)` blocks), and causal with a sliding window
and no gate (`swa`); with the lengths divisible by 16 (as the JIT specialises T = 8192) and, for
the forward, the gated backward and the dS path, without. The backward's kernels are those of each
recipe (`recipe.RECIPES`) that applies to a form. The fixed-tile launches `bwd_config` picks (fp32,
packed sequences) and the decode kernels at their one config. Spills are bounded:
MAX_STACK with aligned lengths, UNALIGNED_STACK without (the dS path's dK/dV configs spill up to
344 B per thread there with Triton 3.6, 80 B aligned; spills cost speed, not correctness).
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.attention import triton_bwd as B
from lt2dsl.kernels.attention import triton_decode as Dec
from lt2dsl.kernels.attention import triton_fwd as F
from lt2dsl.kernels.attention.recipe import RECIPES, ds_applies
from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.common.attn_triton import dot_precision, pow2

MAX_STACK, UNALIGNED_STACK = 512, 640
LENGTHS = ("Tq", "Tk", "NROWS")
INTS = (
    "Tq",
    "Tk",
    "qoff",
    "W",
    "KOFF",
    "NROWS",
    "BH0",
    "L",
    "CHUNK",
    "SKB",
    "SKL",
    "SKH",
    "SVB",
    "SVL",
    "SVH",
)
SCALARS = {**{n: "i32" for n in INTS}, "qk_scale": "fp32", "scale": "fp32"}
HQ, GRP = 16, 1
# (name, causal, window, gate mode): sdpa-gated full attention and an ungated sliding window
FORMS = (("gate", True, False, 1), ("swa", True, True, 0))


def attn_pointers(dt: str) -> dict:
    p = {n: dt for n in ("Q", "K", "V", "GATE", "O", "DO", "DU", "DG", "DQ", "DK", "DV_OUT", "DS")}
    return {**p, "LSE": "*fp32", "DELTA": "*fp32", "O_PART": "*fp32", "LSE_PART": "*fp32",
            "CU_Q": "*i32", "CU_K": "*i32", "BLK_MAP": "*i32", "SEQLENS": "*i32"}  # fmt: skip


def attn_constexprs(D: int, dtype: torch.dtype, causal: bool, window: bool, varlen: bool = False) -> dict:
    return dict(HQ=HQ, GRP=GRP, D=D, DV=D, BD=pow2(D), BDV=pow2(D), CAUSAL=causal, HAS_W=window, KSTRIDE=1,
                VARLEN=varlen, DOT_PREC=dot_precision(dtype))  # fmt: skip


def _jobs(name, tuned, dt, cex, aligned: bool, launch=None) -> list[Job]:
    """With the lengths divisible by 16 or not; spills bounded at 16 bits only (fp32's FMA dots at
    D = 128 spill kilobytes: the fp32 path is for accuracy, not speed)."""
    suffix = "" if aligned else "-Todd"
    stack = None if dt == "*fp32" else MAX_STACK if aligned else UNALIGNED_STACK
    lengths = LENGTHS if aligned else ()
    return tuned_jobs(name + suffix, tuned, attn_pointers(dt), SCALARS, cex, launch=launch, aligned=lengths,
                      max_stack=stack)  # fmt: skip


def _recipes(window: bool, varlen: bool = False) -> list[str]:
    """The dQ forms of the recipes that apply to a form: "ds" and "split", or "split" alone."""
    applies = ds_applies(7 if window else None, [0] if varlen else None, 1, 0, 0)
    return sorted({r.dq for r in RECIPES.values() if r.dq == "split" or applies})


def _forward(aligned: bool) -> list[Job]:
    """bf16 at D = 64 and 128 in each form; fp32 once (aligned, gated)."""
    jobs = []
    for D, dtype in ((64, torch.bfloat16), (128, torch.bfloat16), (128, torch.float32)):
        cfg = F.fwd_config(D, dtype)
        dt = "*fp32" if dtype == torch.float32 else "*bf16"
        tiles = {"BM": cfg["BM"], "BN": cfg["BN"]}
        for form, causal, window, gate in FORMS:
            if dt == "*fp32" and (window or not aligned):
                continue
            order = F.launch_order(causal, window or None, False)
            cex = dict(attn_constexprs(D, dtype, causal, window), GATE_MODE=gate, ORDER=order, **tiles)
            launch = (cfg["num_warps"], cfg["num_stages"])
            jobs += _jobs(f"attn/fwd-{form}-D{D}-{dt[1:]}", F._attn_fwd_kernel, dt, cex, aligned, launch)
    return jobs


def _backward_tuned(aligned: bool) -> list[Job]:
    """The autotuned backward (bf16, D ≤ 128, fixed lengths) of each form's recipes: the split dQ
    kernel with its dK/dV kernel, and the dS path (dK/dV storing dS, dQ = dS K). With unaligned
    lengths the gated form only (the window changes no tile)."""
    jobs, dt = [], "*bf16"
    for form, causal, window, _ in FORMS if aligned else FORMS[:1]:
        com = attn_constexprs(128, torch.bfloat16, causal, window)
        o_q = F.launch_order(causal, window or None, False)
        for dq in _recipes(window):
            kv = dict(com, ORDER=0, STORE_DS=dq == "ds")
            if dq == "split":
                jobs += _jobs(f"attn/dkdv-{form}", B._dkdv_tuned, dt, kv, aligned)
                jobs += _jobs(f"attn/dq-{form}", B._dq_tuned, dt, dict(com, ORDER=o_q), aligned)
                continue
            jobs += _jobs("attn/dkdv-ds", B._dkdv_ds_tuned, dt, kv, aligned)
            ds = {n: com[n] for n in ("HQ", "GRP", "D", "BD", "CAUSAL", "DOT_PREC")}
            jobs += _jobs("attn/dq-ds", B._dq_ds_tuned, dt, dict(ds, ORDER=o_q), aligned)
    return jobs


def _backward_fixed() -> list[Job]:
    """`bwd_config`'s fixed tiles, each recipe's kernels: fp32 (both dQ forms) and packed bf16
    sequences (the split dQ kernel alone)."""
    jobs = []
    for dtype, varlen in ((torch.float32, False), (torch.bfloat16, True)):
        cfg, dt = B.bwd_config(128, dtype), "*fp32" if dtype == torch.float32 else "*bf16"
        com, tag = attn_constexprs(128, dtype, True, False, varlen), "varlen" if varlen else "fp32"
        kv, q = cfg["kv"], cfg["q"]
        kv_tiles, q_tiles = {"BM": kv["BM"], "BN": kv["BN"]}, {"BM": q["BM"], "BN": q["BN"]}
        forms = _recipes(False, varlen)
        for store_ds in (dq == "ds" for dq in forms):
            cex = dict(com, ORDER=0, STORE_DS=store_ds, **kv_tiles)
            name = f"attn/dkdv-{tag}" + ("-ds" if store_ds else "")
            jobs += _jobs(name, B._bwd_dkdv_kernel, dt, cex, True, (kv["num_warps"], kv["num_stages"]))
        o_q = F.launch_order(True, None, varlen)
        cex = dict(com, ORDER=o_q, **q_tiles)
        jobs += _jobs(f"attn/dq-{tag}", B._bwd_dq_kernel, dt, cex, True, (q["num_warps"], q["num_stages"]))
        if "ds" in forms:
            ds = cfg["ds"]
            cex = {n: com[n] for n in ("HQ", "GRP", "D", "BD", "CAUSAL", "DOT_PREC")}
            cex.update(ORDER=o_q, BM=ds["BM"], BN=ds["BN"])
            launch = (ds["num_warps"], ds["num_stages"])
            jobs += _jobs(f"attn/dq-ds-{tag}", B._bwd_dq_ds_kernel, dt, cex, True, launch)
    return jobs


def _pre_and_decode() -> list[Job]:
    """The backward's row pass at each gate mode (64-row blocks, Triton's default launch) and the
    split-K decode of one token with 4 query heads per kv head: bf16 at 32 splits, the ring cache."""
    jobs = []
    for gate in (0, 1, 2):
        cex = dict(HQ=HQ, DV=128, BDV=128, BM=64, GATE_MODE=gate)
        jobs += _jobs(f"attn/bwd_pre-g{gate}", B._bwd_pre_kernel, "*bf16", cex, True, (4, 3))
    grp, nsplit = 4, 32
    split = dict(Tq=1, HQ=16, GRP=grp, D=128, DV=128, BD=128, BDV=128, BR=pow2(grp), BN=64, NSPLIT=nsplit,
                 DOT_PREC=dot_precision(torch.bfloat16))  # fmt: skip
    for window, ring in ((False, False), (True, True)):
        cex = dict(split, HAS_W=window, RING=ring)
        jobs += _jobs(f"attn/decode_split-w{window:d}", Dec._decode_split_kernel, "*bf16", cex, True, (4, 3))
    comb = dict(Tq=1, HQ=16, GRP=grp, DV=128, BDV=128, BR=pow2(grp), NSPLIT=nsplit, BS=nsplit)
    for gate in (0, 1, 2):
        cex = dict(comb, GATE_MODE=gate)
        jobs += _jobs(f"attn/decode_combine-g{gate}", Dec._decode_combine_kernel, "*bf16", cex, True, (4, 3))
    return jobs


def jobs() -> list[Job]:
    out = []
    for aligned in (True, False):
        out += _forward(aligned) + _backward_tuned(aligned)
    return out + _backward_fixed() + _pre_and_decode()
