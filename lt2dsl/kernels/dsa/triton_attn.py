"""Triton sparse attention over a per-query key selection (DSA's main attention), forward and backward.

Indices are `[B, Tq, NIDX]` (one selection shared by every head: DSA) or `[B, Tq, HKV, NIDX]` (one
per kv head: NSA's selected branch, blocks expanded to tokens). One program per (query t,
batch · kv head) stacks the G query heads of the group as the rows of a tile (padded to ≥ 16) and
gathers the selected keys in chunks of BK indices; an index is used iff 0 ≤ s ≤ pos(t) (so −1 padding
and out-of-range entries drop). Indices must not repeat (the indexer's never do). Where those
programs are too few to fill the GPU (a decode step: B·HKV of them, each gathering its whole
selection on one SM), each selection is split over several programs writing partial (o, lse) and a
combine kernel merges them by lse (flash-decoding; `split_count`). Backward: everything
is computed in the transposed orientation (sᵀ = k qᵀ, dpᵀ = v dOᵀ, dqᵀ = kᵀ dsᵀ) so no dot result is
ever transposed into another dot (the Hopper miscompile); dK/dV are scattered with fp32 atomics,
since the keys a query selected belong to nobody else's tile (`dkdv="atomic"`), or gathered by key
with no atomics (`dkdv="by_key"`: the selection inverted, `triton_attn_bykey`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..attention.triton_bwd import bwd_preprocess
from ..attention.triton_fwd import LOG2E, NEG_BIG
from ..common.attn_triton import (
    dot_precision,
    head_constexprs,
    load_rows,
    mm,
    pow2,
    rows_mask,
    rows_ptr,
    softmax_init,
    softmax_step,
)
from ..common.attn_utils import rows_contiguous
from ..common.backend import new_empty, triton_interpreting
from .triton_attn_bykey import dkdv_by_key

# how `sparse_attn_bwd` sums dk, dv over the queries that selected each key ("auto": `resolve_dkdv`)
DKDV_MODES = ("atomic", "by_key", "auto")
# the form a model's backward (`lt2dsl::dsa_attn_bwd` with dkdv "") takes; `bench/train_throughput.py
# --dsa-dkdv` sets it to time whole training steps each way
DEFAULT_DKDV = "auto"
# "auto" gathers by key where a kv head serves at most this many query heads. Measured (H200,
# `bench/dsa_sparse_bwd.py`, the hybrid's B=4, T=8192, 16 query heads of 128, top-k 2048, bf16):
# 16 kv heads (a group of 1) 343.7 ms by atomics, 98.5 by key; 1 kv head (a group of 16) 21.2 by
# atomics, 33.3 by key (14.3 of it the inverse index). A group's query heads share one tile, so
# the atomics' count falls with the group size while the gather's cost barely moves: interpolated
# between the two, by key is ahead up to groups of 8.
BY_KEY_MAX_GROUP = 8


def resolve_dkdv(dkdv: str, group: int) -> str:
    """The form `dkdv` names, "atomic" or "by_key"; "auto" picks by the query heads per kv head
    (`group`)."""
    if dkdv not in DKDV_MODES:
        raise ValueError(f"dkdv must be one of {DKDV_MODES}, got {dkdv!r}")
    if dkdv == "auto":
        return "by_key" if group <= BY_KEY_MAX_GROUP else "atomic"
    return dkdv


@triton.jit
def _gather_rows(base, idx, offs, WIDTH: tl.constexpr, HKV: tl.constexpr, ok):
    """`[BK, B?]` rows of a `[T, HKV, WIDTH]` slab (already offset to batch and head) at positions idx."""
    return tl.load(
        base + (idx.to(tl.int64) * HKV)[:, None] * WIDTH + offs[None, :],
        mask=ok[:, None] & (offs[None, :] < WIDTH),
        other=0.0,
    )


@triton.jit
def _gather_strided(base, idx, offs, WIDTH: tl.constexpr, ROW_STRIDE, ok):
    """`[BK, B?]` rows at positions idx of a slab whose rows are ROW_STRIDE elements apart."""
    return tl.load(
        base + (idx.to(tl.int64) * ROW_STRIDE)[:, None] + offs[None, :],
        mask=ok[:, None] & (offs[None, :] < WIDTH),
        other=0.0,
    )


@triton.jit
def _query_group(
    Q, Tq, Tk, HQ: tl.constexpr, GRP: tl.constexpr,
    D: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BR: tl.constexpr,
):  # fmt: skip
    """The program's query t and kv head hk (grid `(Tq, B·HKV)`): (t, b, hk, t's key position, group
    rows r `[BR]`, rows in range, head-dim and value-dim offsets, rows of Q `[BR]`, q `[BR, BD]`)."""
    HKV = HQ // GRP
    t, pid = tl.program_id(0), tl.program_id(1)
    b, hk = pid // HKV, pid % HKV
    pos = t + Tk - Tq
    r = tl.arange(0, BR)
    in_r = r < GRP
    offs_d, offs_dv = tl.arange(0, BD), tl.arange(0, BDV)
    row = ((b * Tq + t) * HQ + hk * GRP + r).to(tl.int64)
    q = load_rows(Q, row, D, in_r, offs_d, D)
    return t, b, hk, pos, r, in_r, offs_d, offs_dv, row, q


@triton.jit
def _fwd_setup(
    Q, K, V, IDX, Tq, Tk, SKB, SKH, SVB, SVH, HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, BR: tl.constexpr, IDX_H: tl.constexpr, NIDX,
):  # fmt: skip
    """`_query_group`'s values and the program's k, v and index bases."""
    t, b, hk, pos, r, in_r, offs_d, offs_dv, row, q = _query_group(Q, Tq, Tk, HQ, GRP, D, BD, BDV, BR)
    # element strides (batch, position, head) of k and v, last dim contiguous: a decode step reads
    # the cache's views in place instead of a contiguous copy of the whole cache
    k_base = K + b.to(tl.int64) * SKB + hk.to(tl.int64) * SKH
    v_base = V + b.to(tl.int64) * SVB + hk.to(tl.int64) * SVH
    idx_base = IDX + ((b * Tq + t) * IDX_H + (hk if IDX_H > 1 else 0)).to(tl.int64) * NIDX
    return t, b, hk, pos, r, in_r, offs_d, offs_dv, row, q, k_base, v_base, idx_base


@triton.jit
def _attend(
    q, k_base, v_base, idx_base, lo, hi, pos, Tk, qk_scale, offs_d, offs_dv, SKT, SVT,
    D: tl.constexpr, DV: tl.constexpr, BR: tl.constexpr, BDV: tl.constexpr, BK: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Online softmax of the query rows over selection slots [lo, hi): (acc, running max, sum)."""
    acc, m_i, l_i = softmax_init(BR, BDV, NEG_BIG)
    for i0 in range(lo, hi, BK):
        j = i0 + tl.arange(0, BK)
        idx = tl.load(idx_base + j, mask=j < hi, other=-1)
        ok = (idx >= 0) & (idx <= pos) & (idx < Tk)
        kt = tl.trans(_gather_strided(k_base, idx, offs_d, D, SKT, ok))
        s = tl.where(ok[None, :], mm(q, kt, DOT_PREC) * qk_scale, float("-inf"))
        m_new, alpha, p, l_i = softmax_step(s, m_i, l_i)
        v = _gather_strided(v_base, idx, offs_dv, DV, SVT, ok)
        acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, DOT_PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _sparse_fwd_kernel(
    Q, K, V, IDX, O, LSE, Tq, Tk, NIDX, qk_scale, NROWS, SKB, SKT, SKH, SVB, SVT, SVH,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, IDX_H: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """o[b, t, h] over the selected keys; LSE `[HQ, B·Tq]` log2 units (+inf if nothing selected)."""
    t, b, hk, pos, r, in_r, offs_d, offs_dv, row, q, k_base, v_base, idx_base = _fwd_setup(
        Q, K, V, IDX, Tq, Tk, SKB, SKH, SVB, SVH, HQ, GRP, D, BD, BDV, BR, IDX_H, NIDX
    )
    acc, m_i, l_i = _attend(q, k_base, v_base, idx_base, 0, NIDX, pos, Tk, qk_scale, offs_d, offs_dv,
                            SKT, SVT, D, DV, BR, BDV, BK, DOT_PREC)  # fmt: skip
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    tl.store(rows_ptr(O, row, DV, offs_dv), o.to(O.dtype.element_ty), mask=rows_mask(in_r, offs_dv, DV))
    lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    tl.store(LSE + (hk * GRP + r).to(tl.int64) * NROWS + b * Tq + t, lse, mask=in_r)


@triton.jit
def _sparse_split_kernel(
    Q, K, V, IDX, O_PART, LSE_PART, Tq, Tk, NIDX, CHUNK, qk_scale, SKB, SKT, SKH, SVB, SVT, SVH,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, IDX_H: tl.constexpr, NSPLIT: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Split `program_id(2)` of a selection (slots [split·CHUNK, (split+1)·CHUNK)): the partial o
    (normalised over the split) and its lse (log2 units, −inf if the split selected nothing)."""
    t, b, hk, pos, r, in_r, offs_d, offs_dv, row, q, k_base, v_base, idx_base = _fwd_setup(
        Q, K, V, IDX, Tq, Tk, SKB, SKH, SVB, SVH, HQ, GRP, D, BD, BDV, BR, IDX_H, NIDX
    )
    split = tl.program_id(2)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, NIDX)
    acc, m_i, l_i = _attend(q, k_base, v_base, idx_base, lo, hi, pos, Tk, qk_scale, offs_d,
                            offs_dv, SKT, SVT, D, DV, BR, BDV, BK, DOT_PREC)  # fmt: skip
    empty = l_i == 0.0
    part = ((t * tl.num_programs(1) + tl.program_id(1)) * NSPLIT + split).to(tl.int64) * BR + r
    # the group's rows only: with one query head a kv head (a group of 1) 15 of the 16 rows of a
    # tile are padding, and the partials are written and read back once per split
    tl.store(O_PART + part[:, None] * BDV + offs_dv[None, :], acc / tl.where(empty, 1.0, l_i)[:, None],
             mask=in_r[:, None])  # fmt: skip
    tl.store(
        LSE_PART + part, tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i))), mask=in_r
    )


@triton.jit
def _sparse_combine_kernel(
    O_PART, LSE_PART, O, LSE, Tq, NROWS,
    HQ: tl.constexpr, GRP: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr, BR: tl.constexpr,
    NSPLIT: tl.constexpr, BS: tl.constexpr,
):  # fmt: skip
    """Merge the NSPLIT partials of one (query t, batch · kv head, row r of the group) by their
    lse: o and LSE as `_sparse_fwd_kernel` writes them (+inf where no split selected anything).
    Program (t, b·HKV + hk, r); the splits are one vector of BS ≥ NSPLIT, so their loads go out
    together instead of one dependent round trip a split."""
    HKV = HQ // GRP
    t, pid, r = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, hk = pid // HKV, pid % HKV
    sp = tl.arange(0, BS)
    live = sp < NSPLIT
    part = ((t * tl.num_programs(1) + pid) * NSPLIT + sp).to(tl.int64) * BR + r
    lse_s = tl.load(LSE_PART + part, mask=live, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m > float("-inf"), m, 0.0)
    w = tl.where(lse_s > float("-inf"), tl.exp2(lse_s - m_safe), 0.0)
    den = tl.sum(w, 0)
    offs_dv = tl.arange(0, BDV)
    o_p = tl.load(O_PART + part[:, None] * BDV + offs_dv[None, :], mask=live[:, None], other=0.0)
    empty = den == 0.0
    o = tl.sum(w[:, None] * o_p, 0) / tl.where(empty, 1.0, den)
    row = ((b * Tq + t) * HQ + hk * GRP + r).to(tl.int64)
    tl.store(O + row * DV + offs_dv, o.to(O.dtype.element_ty), mask=offs_dv < DV)
    lse = tl.where(empty, float("inf"), m_safe + tl.log2(tl.where(empty, 1.0, den)))
    tl.store(LSE + (hk * GRP + r).to(tl.int64) * NROWS + b * Tq + t, lse)


@triton.jit
def _sparse_bwd_kernel(
    Q, K, V, DO, IDX, LSE, DELTA, DQ, DK, DV_ACC, Tq, Tk, NIDX, qk_scale, scale, NROWS,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, IDX_H: tl.constexpr, DOT_PREC: tl.constexpr,
    DKDV: tl.constexpr,
):  # fmt: skip
    """dq of one query's G heads; with DKDV also dk, dv of its selected keys added atomically into
    fp32 buffers (without, DK and DV_ACC are unused: `triton_attn_bykey` computes them)."""
    HKV = HQ // GRP
    t, b, hk, pos, r, in_r, offs_d, offs_dv, row, q = _query_group(Q, Tq, Tk, HQ, GRP, D, BD, BDV, BR)
    do = load_rows(DO, row, DV, in_r, offs_dv, DV)
    qt, dot_ = tl.trans(q), tl.trans(do)
    lse = tl.load(LSE + (hk * GRP + r).to(tl.int64) * NROWS + b * Tq + t, mask=in_r, other=float("inf"))
    delta = tl.load(DELTA + (hk * GRP + r).to(tl.int64) * NROWS + b * Tq + t, mask=in_r, other=0.0)
    kv_off = b.to(tl.int64) * Tk * HKV + hk
    idx_base = IDX + ((b * Tq + t) * IDX_H + (hk if IDX_H > 1 else 0)).to(tl.int64) * NIDX
    dqt = tl.zeros([BD, BR], dtype=tl.float32)
    for i0 in range(0, NIDX, BK):
        j = i0 + tl.arange(0, BK)
        idx = tl.load(idx_base + j, mask=j < NIDX, other=-1)
        ok = (idx >= 0) & (idx <= pos) & (idx < Tk)
        k = _gather_rows(K + kv_off * D, idx, offs_d, D, HKV, ok)
        v = _gather_rows(V + kv_off * DV, idx, offs_dv, DV, HKV, ok)
        pt = tl.where(ok[:, None], tl.exp2(mm(k, qt, DOT_PREC) * qk_scale - lse[None, :]), 0.0)
        dpt = mm(v, dot_, DOT_PREC)
        dst = pt * (dpt - delta[None, :])
        dqt += mm(tl.trans(k), dst.to(k.dtype), DOT_PREC)
        if DKDV:
            dv_blk = mm(pt.to(do.dtype), do, DOT_PREC)
            dk_blk = mm(dst.to(q.dtype), q, DOT_PREC) * scale
            kv_rows = kv_off + idx.to(tl.int64) * HKV
            tl.atomic_add(
                DK + kv_rows[:, None] * D + offs_d[None, :],
                dk_blk,
                mask=ok[:, None] & (offs_d[None, :] < D),
                sem="relaxed",
            )
            tl.atomic_add(
                DV_ACC + kv_rows[:, None] * DV + offs_dv[None, :],
                dv_blk,
                mask=ok[:, None] & (offs_dv[None, :] < DV),
                sem="relaxed",
            )
    tl.store(
        DQ + row[None, :] * D + offs_d[:, None],
        (dqt * scale).to(DQ.dtype.element_ty),
        mask=in_r[None, :] & (offs_d[:, None] < D),
    )


def _cfg(dtype: torch.dtype) -> dict:
    """Index chunk BK and launch settings: BK=64, 4 warps, 2 stages on the GPU (no autotune)."""
    if triton_interpreting():
        return dict(BK=16, num_warps=1, num_stages=1)
    return dict(BK=32 if dtype == torch.float32 else 64, num_warps=4, num_stages=2)


def _launch(q, k, v, indices) -> dict:
    """The constexprs and launch settings both sparse kernels take for q `[B, Tq, HQ, K]`, k/v
    `[B, Tk, HKV, *]` and indices `[B, Tq, (HKV,) NIDX]`."""
    HQ, HKV = q.shape[2], k.shape[2]
    cfg = _cfg(q.dtype)
    return dict(
        **head_constexprs(q, k, v),
        BR=pow2(HQ // HKV),
        BK=cfg["BK"],
        IDX_H=indices.shape[2] if indices.dim() == 4 else 1,
        DOT_PREC=dot_precision(q.dtype),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def split_count(programs: int, nidx: int, bk: int, device) -> int:
    """Splits of each selection in the forward: 1 where the `programs` = Tq·B·HKV programs of one
    selection each fill the GPU (prefill, training); else (a decode step) enough for ≈ 2 programs
    an SM, each ≥ 2·BK slots, so the gathers of a short grid run on every SM. Under the interpreter
    2 for small grids, so the CPU tests run the split path."""
    if triton_interpreting():
        return 2 if programs <= 8 and nidx > bk else 1
    n_sm = torch.cuda.get_device_properties(device).multi_processor_count
    if programs >= n_sm:
        return 1
    return max(1, min(triton.cdiv(2 * n_sm, programs), triton.cdiv(nidx, 2 * bk)))


def sparse_attn_fwd(q, k, v, indices, scale: float, splits: int | None = None):
    """q `[B, Tq, HQ, K]`, k/v `[B, Tk, HKV, *]` (any strides but a contiguous last dim), indices
    `[B, Tq, (HKV,) NIDX]`; `splits` of each selection (`split_count` when None: one program a
    (query, kv head) where those fill the GPU, else partials merged by a combine kernel).

    Returns (o `[B, Tq, HQ, V]`, lse `[HQ, B·Tq]`).
    """
    k, v = rows_contiguous(k), rows_contiguous(v)
    B, Tq, HQ, D = q.shape
    Tk, HKV, DV = k.shape[1], k.shape[2], v.shape[3]
    nidx = indices.shape[-1]
    o = new_empty(v, B, Tq, HQ, DV)
    lse = new_empty(q, HQ, B * Tq, dtype=torch.float32)
    strides = (k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))
    cex = _launch(q, k, v, indices)
    ns = split_count(Tq * B * HKV, nidx, cex["BK"], q.device) if splits is None else splits
    chunk = triton.cdiv(triton.cdiv(nidx, max(ns, 1)), cex["BK"]) * cex["BK"]
    ns = triton.cdiv(nidx, chunk) if nidx else 1
    if ns <= 1:
        _sparse_fwd_kernel[(Tq, B * HKV)](
            q, k, v, indices, o, lse, Tq, Tk, nidx, scale * LOG2E, B * Tq, *strides, **cex
        )  # fmt: skip
        return o, lse
    BR, BDV = cex["BR"], cex["BDV"]
    o_part = new_empty(q, Tq * B * HKV * ns * BR, BDV, dtype=torch.float32)
    lse_part = new_empty(q, Tq * B * HKV * ns * BR, dtype=torch.float32)
    _sparse_split_kernel[(Tq, B * HKV, ns)](
        q, k, v, indices, o_part, lse_part, Tq, Tk, nidx, chunk, scale * LOG2E, *strides, NSPLIT=ns, **cex
    )  # fmt: skip
    _sparse_combine_kernel[(Tq, B * HKV, HQ // HKV)](
        o_part, lse_part, o, lse, Tq, B * Tq, HQ=HQ, GRP=HQ // HKV, DV=DV, BDV=BDV, BR=BR, NSPLIT=ns,
        BS=triton.next_power_of_2(ns), num_warps=cex["num_warps"], num_stages=1,
    )  # fmt: skip
    return o, lse


def sparse_attn_bwd(do, q, k, v, o, lse, indices, scale: float, dkdv: str = "atomic"):
    """(dq, dk, dv) of `sparse_attn_fwd` for contiguous do, q `[B, Tq, HQ, *]` and k, v
    `[B, Tk, HKV, *]`.

    Args:
        dkdv (str, Optional): how dk, dv are summed over the queries that selected each key:
            "atomic" (the dq kernel adds them into fp32 buffers with atomics), "by_key" (one
            program per key block gathers its queries, `triton_attn_bykey`; the dq kernel then
            skips them; more memory: the inverted selection) or "auto" (`resolve_dkdv`).
            Default: `"atomic"`.
    """
    if dkdv not in DKDV_MODES:
        raise ValueError(f"dkdv must be one of {DKDV_MODES}, got {dkdv!r}")
    B, Tq, HQ, _ = q.shape
    Tk, HKV = k.shape[1], k.shape[2]
    dkdv = resolve_dkdv(dkdv, HQ // HKV)
    delta = bwd_preprocess(o, do, None)[0]
    dq = new_empty(q, *q.shape)
    atomic = dkdv == "atomic"
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device) if atomic else None
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device) if atomic else None
    _sparse_bwd_kernel[(Tq, B * HKV)](
        q, k, v, do, indices, lse, delta, dq, dk, dv, Tq, Tk, indices.shape[-1], scale * LOG2E, scale,
        B * Tq, DKDV=atomic, **_launch(q, k, v, indices),
    )  # fmt: skip
    if atomic:
        return dq, dk.to(k.dtype), dv.to(v.dtype)
    return dq, *dkdv_by_key(do, q, k, v, lse, delta, indices, scale)
