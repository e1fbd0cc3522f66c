"""dK, dV of DSA's sparse attention gathered by key: no atomics (`sparse_attn_bwd(dkdv="by_key")`).

The selection `[B, Tq, (HKV,) NIDX]` is inverted first (`inverse_index`, torch ops only): every
valid entry (0 ≤ s ≤ pos(t) = t + Tk − Tq, s < Tk; −1 pads and future or out-of-range keys drop)
is grouped by (b, kv head of a per-head selection, key block s // BN), and the queries t of one
group are listed once each, in increasing t, with a BN-bit mask of the block's keys t selected
(indices never repeat within a row, so the mask's bits are distinct and a sum is their union).
One program per (key block, b · kv head) then owns those BN rows of dK and dV: it loops over its
query list in chunks of BE queries, stacks the G query heads of each as the rows of a tile (G
padded to a power of two), gathers q, dO, lse and delta there, recomputes
pᵀ = exp2(k qᵀ · qk_scale − lse) and dsᵀ = pᵀ ⊙ (v dOᵀ − delta) on the selected (key, query) pairs
only, accumulates dk = scale · dsᵀ q and dv = pᵀ dO in fp32 and stores each row once; a block
nobody selects stores zeros. A block of keys rather than one key: the products are tensor-core
dots (≥ 16 keys), and a query row is gathered once for all the block's keys it selected.
Everything is computed keys-major, so no dot result is transposed into another dot (the Hopper
miscompile). Programs run (b, kv head)-major, key blocks ascending within: a causal selection
picks low keys most, so each head's heaviest blocks start first and the grid ends on light ones,
and the programs running together gather the q and dO rows of one head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..attention.triton_fwd import LOG2E
from ..common.attn_triton import dot_precision, head_constexprs, load_rows, mm, rows_mask, rows_ptr
from ..common.backend import new_empty, triton_interpreting
from ..common.tl_util import cast


def inverse_index(indices: torch.Tensor, Tq: int, Tk: int, block: int = 1):
    """The selection `[B, Tq, NIDX]` or `[B, Tq, H, NIDX]` grouped by key block.

    Returns (offsets `[B·H·nb + 1]` int64, queries int32, masks int32) with H = 1 for a shared
    selection and nb = ⌈Tk / block⌉: group g = (b·H + h)·nb + s // block lists the queries t that
    selected a key of its block at `queries[offsets[g] : offsets[g + 1]]` in increasing t, and
    `masks` the same slots' bits 1 << (s % block) of the keys selected. With `block` = 1 every
    mask is 1 and the groups are single keys. Entries past `offsets[-1]` are scratch. No host sync.
    """
    if not 1 <= block <= 31:
        raise ValueError(f"block must be in 1..31 (an int32 bit mask), got {block}")
    B, H = indices.shape[0], indices.shape[2] if indices.dim() == 4 else 1
    nb = triton.cdiv(Tk, block)
    top = B * H * nb * Tq * block
    dt = torch.int32 if top < 2**31 - 1 else torch.int64

    def ar(n, dim):  # arange(n) along `dim` of the `[B, Tq, H, NIDX]` entries
        return torch.arange(n, device=indices.device, dtype=dt).view([n if d == dim else 1 for d in range(4)])

    idx = indices.reshape(B, Tq, H, -1)
    ok = (idx >= 0) & (idx <= ar(Tq, 1) + (Tk - Tq)) & (idx < Tk)
    s = idx.clamp(0, Tk - 1).to(dt)
    # one sort key per entry: (group, t, key within the block); dropped entries sort last
    key = (((ar(B, 0) * H + ar(H, 2)) * nb + s // block) * Tq + ar(Tq, 1)) * block + s % block
    key = torch.sort(torch.where(ok, key, top).flatten()).values
    pair = key // block  # (group, t) of each entry
    first = torch.ones_like(pair, dtype=torch.bool)
    first[1:] = pair[1:] != pair[:-1]
    slot = torch.cumsum(first, 0) - 1  # the entry's (group, t) pair, numbered in sort order
    pairs = torch.full_like(pair, top // block).scatter_(0, slot, pair)
    bits = torch.ones_like(pair, dtype=torch.int32) << (key % block).to(torch.int32)
    masks = torch.zeros_like(bits).scatter_add_(0, slot, bits)
    offsets = torch.searchsorted(pairs, ar(B * H * nb + 1, 0).flatten() * Tq)
    return offsets, (pairs % Tq).to(torch.int32), masks


@triton.jit
def _dkdv_bykey_kernel(
    Q, K, V, DO, LSE, DELTA, OFFS, QUERIES, MASKS, DK, DV_OUT, Tq, Tk, NBLK, qk_scale, scale, NROWS,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, BN: tl.constexpr, BG: tl.constexpr, BE: tl.constexpr, IDX_H: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """dk, dv of keys [blk·BN, blk·BN + BN) of one kv head (grid `(B·HKV·NBLK,)`, key blocks
    fastest), summed over the query rows that selected them; each row stored once."""
    HKV = HQ // GRP
    pid = tl.program_id(0)
    bh, blk = pid // NBLK, pid % NBLK
    b, hk = bh // HKV, bh % HKV
    keys = blk * BN + tl.arange(0, BN)
    in_k = keys < Tk
    offs_d, offs_dv = tl.arange(0, BD), tl.arange(0, BDV)
    kv_rows = ((b * Tk + keys) * HKV + hk).to(tl.int64)
    k = load_rows(K, kv_rows, D, in_k, offs_d, D)
    v = load_rows(V, kv_rows, DV, in_k, offs_dv, DV)
    group = (b * IDX_H + (hk if IDX_H > 1 else 0)) * NBLK + blk
    lo = tl.load(OFFS + group)
    hi = tl.load(OFFS + group + 1)
    # row r of a chunk: query slot r // BG of the list, query head hk·GRP + r % BG of the group
    r = tl.arange(0, BE * BG)
    head = hk * GRP + r % BG
    lse_rows = head.to(tl.int64) * NROWS + b * Tq  # of LSE and DELTA `[HQ, B·Tq]`
    dk = tl.zeros([BN, BD], dtype=tl.float32)
    dv = tl.zeros([BN, BDV], dtype=tl.float32)
    for e0 in range(lo, hi, BE):
        e = e0 + r // BG
        ok = (e < hi) & (r % BG < GRP)
        t = tl.load(QUERIES + e, mask=ok, other=0)
        row = ((b * Tq + t) * HQ + head).to(tl.int64)
        q = load_rows(Q, row, D, ok, offs_d, D)
        do = load_rows(DO, row, DV, ok, offs_dv, DV)
        lse = tl.load(LSE + lse_rows + t, mask=ok, other=float("inf"))
        delta = tl.load(DELTA + lse_rows + t, mask=ok, other=0.0)
        # the (key, row) pairs the row's query selected: bit n of its mask is key blk·BN + n
        bits = tl.load(MASKS + e, mask=ok, other=0)
        sel = ((bits[None, :] >> tl.arange(0, BN)[:, None]) & 1) != 0
        pt = tl.where(sel, tl.exp2(mm(k, tl.trans(q), DOT_PREC) * qk_scale - lse[None, :]), 0.0)
        dst = pt * (mm(v, tl.trans(do), DOT_PREC) - delta[None, :])
        dv += mm(cast(pt, do.dtype), do, DOT_PREC)
        dk += mm(cast(dst, q.dtype), q, DOT_PREC)
    tl.store(
        rows_ptr(DK, kv_rows, D, offs_d),
        cast(dk * scale, DK.dtype.element_ty),
        mask=rows_mask(in_k, offs_d, D),
    )
    tl.store(
        rows_ptr(DV_OUT, kv_rows, DV, offs_dv),
        cast(dv, DV_OUT.dtype.element_ty),
        mask=rows_mask(in_k, offs_dv, DV),
    )


def _cfg(dtype: torch.dtype) -> dict:
    """Keys a program BN, query rows a chunk ROWS (BE queries × BG heads) and launch settings:
    16 keys, 64 rows (32 in fp32), 4 warps, 2 stages on the GPU (no autotune)."""
    if triton_interpreting():
        return dict(BN=16, ROWS=16, num_warps=1, num_stages=1)
    return dict(BN=16, ROWS=32 if dtype == torch.float32 else 64, num_warps=4, num_stages=2)


def tile_constexprs(dtype: torch.dtype, grp: int) -> dict:
    """BN, BG (the group's G query heads, padded to a power of two) and BE (queries a chunk) for
    query groups of `grp` heads."""
    cfg = _cfg(dtype)
    BG = triton.next_power_of_2(grp)
    return dict(BN=cfg["BN"], BG=BG, BE=max(1, cfg["ROWS"] // BG))


def launch_constexprs(q, k, v, indices) -> dict:
    """The constexprs and launch settings of `_dkdv_bykey_kernel` for q `[B, Tq, HQ, K]`, k/v
    `[B, Tk, HKV, *]` and indices `[B, Tq, (HKV,) NIDX]`."""
    cfg = _cfg(q.dtype)
    return dict(
        **head_constexprs(q, k, v),
        **tile_constexprs(q.dtype, q.shape[2] // k.shape[2]),
        IDX_H=indices.shape[2] if indices.dim() == 4 else 1,
        DOT_PREC=dot_precision(q.dtype),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def dkdv_by_key(do, q, k, v, lse, delta, indices, scale: float):
    """(dk, dv) of `sparse_attn_fwd` in k's and v's dtypes, for contiguous q, do `[B, Tq, HQ, *]`,
    k, v `[B, Tk, HKV, *]`, lse and delta `[HQ, B·Tq]` (fp32; `bwd_preprocess`'s delta)."""
    B, Tq = q.shape[:2]
    Tk, HKV = k.shape[1], k.shape[2]
    cex = launch_constexprs(q, k, v, indices)
    nblk = triton.cdiv(Tk, cex["BN"])
    dk, dv = new_empty(k, *k.shape), new_empty(v, *v.shape)
    if dk.numel():
        offsets, queries, masks = inverse_index(indices, Tq, Tk, cex["BN"])
        _dkdv_bykey_kernel[(B * HKV * nblk,)](
            q, k, v, do, lse, delta, offsets, queries, masks, dk, dv, Tq, Tk, nblk, scale * LOG2E, scale,
            B * Tq, **cex,
        )  # fmt: skip
    return dk, dv
