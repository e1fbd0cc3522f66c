"""sm_90 compile jobs of DSA's kernels (`common.aot`), also NSA's selected branch: the sparse
attention forward (whole and split, with its combine) and backward (with the atomic dk, dv, dq only,
and the by-key dk, dv; bf16 at D = 128, 16 query heads on one kv head; fp32 once), the
lightning indexer's score kernel (ranked int64 keys, and the radix selection's 32-bit keys) and the
radix top-k selection (one program a row, and the sliced passes and write), each at its launch
code's fixed launch."""

from __future__ import annotations

import itertools

import torch

from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.common.attn_triton import dot_precision, pow2
from lt2dsl.kernels.dsa import triton_attn as A
from lt2dsl.kernels.dsa import triton_attn_bykey as B
from lt2dsl.kernels.dsa.triton_indexer import _indexer_kernel, _indexer_row_kernel
from lt2dsl.kernels.dsa.triton_topk import (
    MERGE_SLICE_KEYS,
    MERGE_WARPS,
    ROW_WARPS,
    SHORT_SLICE_KEYS,
    SLICE_KEYS,
    _merge_bisect_kernel,
    _row_bisect_kernel,
    _select_kernel,
    _slice_bisect_kernel,
    _split_pass_kernel,
    _split_write_kernel,
    _tile,
)

MAX_STACK = 512
INTS = ("Tq", "Tk", "NIDX", "NROWS", "NBLK", "CHUNK", "SKB", "SKT", "SKH", "SVB", "SVT", "SVH")
SCALARS = {**{n: "i32" for n in INTS}, "qk_scale": "fp32", "scale": "fp32"}
# the indexer's and the selection's (their K is the top-k count, the attention's the key pointer)
SELECT_SCALARS = {n: "i32" for n in ("Tq", "Tk", "t0", "C", "KW", "K", "SW", "SL", "S")}
SELECT_SCALARS |= {"idx_scale": "fp32", "w_scale": "fp32"}
# strides and lengths the JIT sees divisible by 16 at the usual sizes (k, v rows are made so:
# `attn_utils.rows_contiguous`)
ALIGNED = ("Tq", "Tk", "NIDX", "NROWS", "SKB", "SKT", "SKH", "SVB", "SVT", "SVH")


def _attention() -> list[Job]:
    jobs = []
    for dtype in (torch.bfloat16, torch.float32):
        cfg, dt = A._cfg(dtype), "*fp32" if dtype == torch.float32 else "*bf16"
        ptrs = {n: dt for n in ("Q", "K", "V", "O", "DO", "DQ")} | {"IDX": "*i64", "LSE": "*fp32"}
        ptrs |= {"DELTA": "*fp32", "DK": "*fp32", "DV_ACC": "*fp32"}
        cex = dict(HQ=16, GRP=16, D=128, DV=128, BD=128, BDV=128, BR=pow2(16), BK=cfg["BK"], IDX_H=1)
        cex["DOT_PREC"] = dot_precision(dtype)
        kw = dict(launch=(cfg["num_warps"], cfg["num_stages"]), aligned=ALIGNED)
        kw["max_stack"] = MAX_STACK if dtype == torch.bfloat16 else None
        jobs += tuned_jobs(f"dsa/sparse_fwd-{dt[1:]}", A._sparse_fwd_kernel, ptrs, SCALARS, cex, **kw)
        jobs += tuned_jobs(f"dsa/sparse_bwd-{dt[1:]}", A._sparse_bwd_kernel, ptrs, SCALARS,
                           cex | {"DKDV": True}, **kw)  # fmt: skip
        # dq only (`dkdv="by_key"`): no dk, dv buffers
        dq_only = cex | {"DKDV": False, "DK": None, "DV_ACC": None}
        jobs += tuned_jobs(f"dsa/sparse_bwd_dq-{dt[1:]}", A._sparse_bwd_kernel, ptrs, SCALARS, dq_only, **kw)
        jobs += _by_key(dtype, dt, ptrs, cex)
        # the decode step's split forward (16 splits: one kv head's selection of 2048 keys at B=1)
        split = ptrs | {"O_PART": "*fp32", "LSE_PART": "*fp32"}
        jobs += tuned_jobs(f"dsa/sparse_split-{dt[1:]}", A._sparse_split_kernel, split, SCALARS,
                           cex | {"NSPLIT": 16}, **kw)  # fmt: skip
        comb = {k: cex[k] for k in ("HQ", "GRP", "DV", "BDV", "BR")} | {"NSPLIT": 16, "BS": 16}
        jobs += tuned_jobs(f"dsa/sparse_combine-{dt[1:]}", A._sparse_combine_kernel, split, SCALARS, comb,
                           launch=(cfg["num_warps"], 1), aligned=(), max_stack=kw["max_stack"])  # fmt: skip
    return jobs


def _by_key(dtype: torch.dtype, dt: str, ptrs: dict, cex: dict) -> list[Job]:
    """`dkdv_by_key`'s kernel at the attention jobs' heads (16 query heads on one kv head) and,
    in bf16, on 16 kv heads (the hybrid's MHA: one query row a head)."""
    cfg = B._cfg(dtype)
    ptrs = ptrs | {"OFFS": "*i64", "QUERIES": "*i32", "MASKS": "*i32", "DK": dt, "DV_OUT": dt}
    kw = dict(launch=(cfg["num_warps"], cfg["num_stages"]), aligned=ALIGNED)
    kw["max_stack"] = MAX_STACK if dtype == torch.bfloat16 else None
    heads = {n: cex[n] for n in ("HQ", "D", "DV", "BD", "BDV", "IDX_H", "DOT_PREC")}
    jobs = []
    for grp in (16, 1) if dtype == torch.bfloat16 else (16,):
        by_key = heads | {"GRP": grp} | B.tile_constexprs(dtype, grp)
        name = f"dsa/sparse_dkdv_bykey-g{grp}-{dt[1:]}"
        jobs += tuned_jobs(name, B._dkdv_bykey_kernel, ptrs, SCALARS, by_key, **kw)
    return jobs


def _indexer() -> list[Job]:
    """`dsa_indexer_triton`: 64 x 128 tiles, 8 warps, 2 stages; 4 index heads of 64 with weights;
    at per-row positions (decode) 128 keys a program against every head, 4 warps.
    The selection (`select_topk`): 2048 keys a step, 4 warps; causal, or at per-row positions."""
    jobs = []
    ptrs = {"QI": "*bf16", "KI": "*bf16", "WI": "*bf16"}
    kw = dict(aligned=(), max_stack=MAX_STACK)
    for u32 in (False, True):
        cex = dict(HI=4, DI=64, BDI=pow2(64), BM=64, BN=128, HAS_W=True, U32=u32)
        cex["DOT_PREC"] = dot_precision(torch.bfloat16)
        keys = {"KEYS": "*i32" if u32 else "*i64"}
        jobs += tuned_jobs(
            f"dsa/indexer-u32{u32:d}", _indexer_kernel, ptrs | keys, SELECT_SCALARS, cex, launch=(8, 2), **kw
        )
    # the decode step's scoring: one query row, the 4 heads as a dot's 16 columns, 128 keys a program
    cex = dict(HI=4, DI=64, BDI=pow2(64), BH=pow2(4), BN=128, HAS_W=True)
    cex["DOT_PREC"] = dot_precision(torch.bfloat16)
    jobs += tuned_jobs("dsa/indexer-row", _indexer_row_kernel, ptrs | {"KEYS": "*i32"}, SELECT_SCALARS, cex,
                       launch=(4, 3), **kw)  # fmt: skip
    sel = {"KEYS": "*i32", "OUT": "*i64", "POS": "*i64"}
    for has_pos in (False, True):
        cex = {"BLK": 2048, "HAS_POS": has_pos}
        jobs += tuned_jobs(f"dsa/select-pos{has_pos:d}", _select_kernel, sel, SELECT_SCALARS, cex,
                           launch=(4, 3), aligned=(), max_stack=MAX_STACK)  # fmt: skip
    return jobs + _split_select() + _bisect_select()


def _bisect_select() -> list[Job]:
    """`select_topk_rows` over a 4k row (an `[8, 1024]` tile) and `select_topk_merge`'s slices of
    MERGE_SLICE_KEYS and its merge of 16 slices' top 512 or 4 slices' top 2048 (8,192 candidates),
    at 8 and 16 warps (ROW_WARPS, MERGE_WARPS, and what bench/dsa_decode_select.py weighs against
    them), causal or at per-row positions."""
    jobs = []
    ptrs = {"KEYS": "*i32", "OUT": "*i64", "POS": "*i64", "CK": "*i32", "CI": "*i32", "CNT": "*i32"}
    slice_r, slice_w = _tile(MERGE_SLICE_KEYS)
    for warps, has_pos in itertools.product(sorted({ROW_WARPS, MERGE_WARPS, 8, 16}), (False, True)):
        kw = dict(launch=(warps, 3), aligned=(), max_stack=MAX_STACK)
        tag = f"w{warps}-pos{has_pos:d}"
        cex = {"R": 8, "W": 1024, "PB": 512, "HAS_POS": has_pos}
        jobs += tuned_jobs(f"dsa/select-rows-{tag}", _row_bisect_kernel, ptrs, SELECT_SCALARS, cex, **kw)
        cex = {"R": slice_r, "W": slice_w, "HAS_POS": has_pos}
        jobs += tuned_jobs(f"dsa/select-slices-{tag}", _slice_bisect_kernel, ptrs, SELECT_SCALARS, cex, **kw)
        for sb, k in ((16, 512), (4, 2048)):
            cex = {"SB": sb, "KP": k, "PB": min(k, 1024), "HAS_POS": has_pos}
            name = f"dsa/select-merge{k}-{tag}"
            jobs += tuned_jobs(name, _merge_bisect_kernel, ptrs, SELECT_SCALARS, cex, **kw)
    return jobs


def _split_select() -> list[Job]:
    """`select_topk_split`: 2048- and 512-key blocks (`SLICE_KEYS`, `SHORT_SLICE_KEYS`), 4 warps;
    the four digit passes and the write, causal or at per-row positions."""
    jobs = []
    ptrs = {"KEYS": "*i32", "OUT": "*i64", "POS": "*i64", "PART": "*i32", "G": "*i32"}
    kw = dict(launch=(4, 3), aligned=("SL",), max_stack=MAX_STACK)
    for blk, has_pos in itertools.product((SLICE_KEYS, SHORT_SLICE_KEYS), (False, True)):
        cex = {"BLK": blk, "SB": 8, "HAS_POS": has_pos}
        tag = f"blk{blk}-pos{has_pos:d}"
        for p in range(4):
            jobs += tuned_jobs(f"dsa/select-split-pass{p}-{tag}", _split_pass_kernel, ptrs, SELECT_SCALARS,
                               cex | {"PASS": p}, **kw)  # fmt: skip
        name = f"dsa/select-split-write-{tag}"
        jobs += tuned_jobs(name, _split_write_kernel, ptrs, SELECT_SCALARS, cex, **kw)
    return jobs


def jobs() -> list[Job]:
    return _attention() + _indexer()
