"""sm_90 compile jobs of NSA's own kernel and of its compressed branch (`common.aot`).

The compressed branch runs the attention kernels with key c at position c·d + l − 1 (KSTRIDE = d,
the `cmp_stride`): bf16, D = 128, 16 query heads on one kv head, causal, no gate; the forward at
`fwd_config`'s tiles, the backward at every autotune config (the dS path takes KSTRIDE 1 only).
The selected branch is DSA's sparse attention (`dsa.aot_jobs`), the window branch the attention's
(`attention.aot_jobs`). `group_probs`: 64 x 64 tiles, 4 warps. The decode step
(`triton_decode`) at the example's geometry (l' = 64, l = 32, d = 16, 16 blocks chosen) over up to
128k slots (2048 selection blocks), bf16, 4 warps (the split form's final choice one); its
branches are DSA's sparse attention.
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.attention import triton_bwd as B
from lt2dsl.kernels.attention import triton_fwd as F
from lt2dsl.kernels.attention.aot_jobs import SCALARS, attn_constexprs, attn_pointers
from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.common.attn_triton import dot_precision, pow2
from lt2dsl.kernels.nsa import triton_decode as TD
from lt2dsl.kernels.nsa.triton_scores import _group_probs_kernel

STRIDE = 16  # the `cmp_stride` of examples/lt2_sparse_nsa.lt2
MAX_STACK = 512


def _compressed() -> list[Job]:
    cex = dict(attn_constexprs(128, torch.bfloat16, True, False), GRP=16, KSTRIDE=STRIDE)
    cfg = F.fwd_config(128, torch.bfloat16)
    fwd = dict(cex, GATE_MODE=0, GATE_EARLY=False, ORDER=F.launch_order(True, None, False), BM=cfg["BM"],
               BN=cfg["BN"])  # fmt: skip
    kw = dict(aligned=("Tq", "Tk", "NROWS"), max_stack=MAX_STACK)
    ptrs = attn_pointers("*bf16")
    jobs = tuned_jobs("nsa/cmp-fwd", F._attn_fwd_kernel, ptrs, SCALARS, fwd,
                      launch=(cfg["num_warps"], cfg["num_stages"]), **kw)  # fmt: skip
    jobs += tuned_jobs("nsa/cmp-dkdv", B._dkdv_tuned, ptrs, SCALARS, dict(cex, ORDER=0, STORE_DS=False), **kw)
    return jobs + tuned_jobs("nsa/cmp-dq", B._dq_tuned, ptrs, SCALARS, dict(cex, ORDER=fwd["ORDER"]), **kw)


def _decode() -> list[Job]:
    ptrs = {"Q": "*bf16", "KC": "*bf16", "VC": "*bf16", "POS": "*i64", "OCMP": "*fp32", "PM": "*fp32"}
    ptrs |= {"IDX": "*i32"}
    scalars = {n: "i32" for n in ("NC", "NSB", "SQB", "SKCB", "SKCN", "SKCH", "SVCB", "SVCN", "SVCH")}
    scalars |= {"qk_scale": "fp32"}
    cex = dict(HQ=16, GRP=16, D=128, DV=128, BD=128, BDV=128, BR=16, BN=TD.select_tile(128), SEL=64, BSEL=64,
               CMP=32, STRIDE=STRIDE, NSEL=16, BNSB=2048, WINDOW=512, BW=512,
               DOT_PREC=dot_precision(torch.bfloat16))  # fmt: skip
    jobs = tuned_jobs("nsa/decode-select", TD.nsa_decode_select_kernel, ptrs, scalars, cex, launch=(4, 1),
                      aligned=(), max_stack=MAX_STACK)  # fmt: skip
    # the split form: the compressed branch over the splits, then the merge and the block choice
    split = {"Q": "*bf16", "KC": "*bf16", "VC": "*bf16", "POS": "*i64", "SC": "*fp32", "M_PART": "*fp32"}
    split |= {"L_PART": "*fp32", "O_PART": "*fp32"}
    scex = {k: cex[k] for k in ("HQ", "GRP", "D", "DV", "BD", "BDV", "BR", "BN", "CMP", "STRIDE", "DOT_PREC")}
    kw = dict(launch=(4, 1), aligned=(), max_stack=MAX_STACK)
    scalars_split = scalars | {"CHUNK": "i32"}
    jobs += tuned_jobs("nsa/decode-cmp-split", TD.nsa_decode_cmp_split_kernel, split, scalars_split,
                       scex | {"NSPLIT": 8}, **kw)  # fmt: skip
    # the block choice of the split form: slices of 64 blocks over 128k slots, then the row's top n
    sl = {"POS": "*i64", "SC": "*fp32", "M_PART": "*fp32", "L_PART": "*fp32", "CAND": "*i64"}
    slcex = dict(HKV=1, GRP=16, BR=16, SEL=64, CMP=32, STRIDE=STRIDE, NSEL=16, BNS=16,
                 BSB=TD.select_slice_blocks(), NSPLIT=8, BS=8)  # fmt: skip
    jobs += tuned_jobs("nsa/decode-slice-select", TD.nsa_decode_slice_select_kernel, sl,
                       {"NC": "i32", "NSB": "i32"}, slcex, **kw)  # fmt: skip
    ch = {"POS": "*i64", "CAND": "*i64", "IDX": "*i32"}
    chcex = dict(HKV=1, SEL=64, BSEL=64, NSEL=16, BC=512, BNSB=2048, WINDOW=512, BW=512)
    jobs += tuned_jobs("nsa/decode-choose", TD.nsa_decode_choose_kernel, ch, {"NCAND": "i32"}, chcex,
                       launch=(1, 1), aligned=(), max_stack=MAX_STACK)  # fmt: skip
    # the mix of the sparse attention's chunks (DSA's split kernel: `dsa.aot_jobs`) per branch
    combine = {"O_PART": "*fp32", "LSE_PART": "*fp32", "OCMP": "*fp32", "CM_PART": "*fp32"}
    combine |= {"CL_PART": "*fp32", "CO_PART": "*fp32", "G": "*bf16", "OUT": "*bf16"}
    cscalars = {"SG": "i32", "NS_SLC": "i32"}
    kernel = TD.nsa_decode_combine_kernel
    for nsc in (0, 64):  # o_cmp from the one-kernel form, or merged from the split form's partials
        ccex = dict(HQ=16, GRP=16, DV=128, BDV=128, BR=16, NSPLIT=24, BS=32, LOGITS=True, NSC=nsc,
                    BSC=max(nsc, 1), CBR=16)  # fmt: skip
        jobs += tuned_jobs(f"nsa/decode-combine-nsc{nsc}", kernel, combine, cscalars, ccex, launch=(4, 1),
                           aligned=())  # fmt: skip
    # the compression of k and v in one launch
    ptrs = {f"{n}{i}": "*bf16" for i in "01" for n in ("X", "BUF", "PE", "W", "BIAS")} | {"POS": "*i64"}
    strides = ("SXB", "SXT", "SXH", "SBB", "SBH", "SBN")
    scalars = {f"{n}{i}": "i32" for i in "01" for n in strides} | {"NC": "i32"}
    for mlp in (False, True):
        cex = dict(HKV=1, D=128, BD=128, CMP=32, BL=32, STRIDE=STRIDE, MLP=mlp, BO=32)
        kernel = TD.nsa_decode_compress_kernel
        jobs += tuned_jobs(f"nsa/decode-compress-{'mlp' if mlp else 'mean'}", kernel, ptrs, scalars, cex,
                           launch=(4, 1), aligned=())  # fmt: skip
    return jobs


def jobs() -> list[Job]:
    ptrs = {"Q": "*bf16", "KC": "*bf16", "LSE": "*fp32", "P": "*fp32"}
    scalars = {n: "i32" for n in ("Tq", "NC", "qoff", "KOFF", "NROWS")} | {"qk_scale": "fp32"}
    cex = dict(HQ=16, GRP=16, D=128, BD=pow2(128), BM=64, BN=64, KSTRIDE=STRIDE,
               DOT_PREC=dot_precision(torch.bfloat16))  # fmt: skip
    probs = tuned_jobs("nsa/group_probs", _group_probs_kernel, ptrs, scalars, cex, launch=(4, 3), aligned=(),
                       max_stack=MAX_STACK)  # fmt: skip
    return probs + _compressed() + _decode()
