"""Triton lightning indexer: index scores as sortable keys, then the top-k per query chunk.

Kernel: one program per (query block, key block, batch) computes
I[t, s] = Σ_j w[t, j] · ReLU(idx_scale · q_idx[t, j] · k_idx[s]) with one `tl.dot` per indexer head.
The weights are read in place (rows `SW` apart: a column slice of a projection output) and scaled by
`w_scale` in the kernel, rounded to their dtype as the unfused `w · w_scale` is (the lowering's
HI^{-1/2}, which then needs no launch of its own). A decode step (one query a row, at per-row
positions) scores with `_indexer_row_kernel`: the row's keys against every head in one dot.
Two selections, each the faster for its output (H200, B=4, T=32k, 4 index heads of 128, top-k
2048):

* the set (what the sparse attention takes; `ordered=False`): 32-bit keys `ordered(I)` and the
  radix select of `triton_topk` (59.0 ms against 74.0 for `torch.topk(sorted=False)` over int64 keys);
* rank order (`dsa_indexer`, `dsa(..., return_indices=True)`): the int64 key
  `ordered(I) · 2^31 + (2^31 − 1 − s)` (−2^63 for s > t) and `torch.topk(sorted=True)` (86.4 ms
  against 90.8 for the radix select followed by a sort of its k entries).

Either way the largest key is the highest score with the lower index on ties, the rule of
`common.attn_utils.rank_keys`. Key blocks entirely after the query block are skipped. Queries go in
chunks so the `[B, chunk, Tk]` key buffer stays near 1 GiB.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.attn_triton import dot_precision, mm, pow2
from ..common.backend import check_triton_dtype, triton_interpreting
from ..common.tl_util import cast
from .triton_topk import select_topk

_INT64_MIN = -(2**63)


@triton.jit
def _u32_keys(score):
    """fp32 scores as the selection's unsigned keys (int32 storage): unsigned order is float order;
    + 0.0 turns −0 into +0 (the reference sees a tie)."""
    bits = (score + 0.0).to(tl.uint32, bitcast=True)
    flip = tl.where((bits >> 31) == 1, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
    return (bits ^ flip).to(tl.int32, bitcast=True)


@triton.jit
def _indexer_kernel(
    QI,
    KI,
    WI,
    KEYS,
    t0,
    Tq,
    Tk,
    C,
    KW,
    idx_scale,
    SW,
    w_scale,
    HI: tl.constexpr,
    DI: tl.constexpr,
    BDI: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    HAS_W: tl.constexpr,
    DOT_PREC: tl.constexpr,
    U32: tl.constexpr,
):
    """KEYS[b, r, s] for chunk rows r (query t0 + r), keys s < KW; QI `[B, Tq, HI, DI]`, KI `[B, Tk, DI]`.

    KEYS is `[B, C, KW]`: KW ≤ Tk stops at the last key any row of the chunk can see. U32: KEYS is
    int32 storage of the unsigned key ordered(I) alone (`triton_topk`), and entries past a row's
    position are left unwritten (the selection reads a row's causal prefix only)."""
    i_m, i_n, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = i_m * BM + tl.arange(0, BM)
    t = t0 + rows
    in_q = (rows < C) & (t < Tq)
    pos = t + (Tk - Tq)
    keys = i_n * BN + tl.arange(0, BN)
    out = KEYS + (b.to(tl.int64) * C + rows)[:, None] * KW + keys[None, :]
    store_mask = (rows < C)[:, None] & (keys < KW)[None, :]
    if i_n * BN > t0 + i_m * BM + BM - 1 + (Tk - Tq):  # the whole block is in every row's future
        if not U32:
            tl.store(out, tl.full([BM, BN], -(2**63), tl.int64), mask=store_mask)
    else:
        offs = tl.arange(0, BDI)
        kt = tl.load(
            KI + (b.to(tl.int64) * Tk + keys)[None, :] * DI + offs[:, None],
            mask=(keys < Tk)[None, :] & (offs[:, None] < DI),
            other=0.0,
        )
        score = tl.zeros([BM, BN], dtype=tl.float32)
        for j in range(HI):
            qrow = (b * Tq + t).to(tl.int64) * HI + j
            q = tl.load(
                QI + qrow[:, None] * DI + offs[None, :], mask=in_q[:, None] & (offs[None, :] < DI), other=0.0
            )
            dots = tl.maximum(mm(q, kt, DOT_PREC) * idx_scale, 0.0)
            if HAS_W:
                b_w = tl.load(WI + (b * Tq + t).to(tl.int64) * SW + j, mask=in_q, other=0.0).to(tl.float32)
                dots = dots * cast(b_w * w_scale, WI.dtype.element_ty).to(tl.float32)[:, None]
            score += dots
        if U32:
            tl.store(out, _u32_keys(score), mask=store_mask)
        else:
            bits = score.to(tl.int32, bitcast=True)
            ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
            key = ordered * 2147483648 + (2147483647 - keys[None, :].to(tl.int64))
            ok = in_q[:, None] & (keys[None, :] <= pos[:, None]) & (keys < Tk)[None, :]
            tl.store(out, tl.where(ok, key, -(2**63)), mask=store_mask)


@triton.jit
def _indexer_row_kernel(
    QI, KI, WI, KEYS, Tq, Tk, KW, idx_scale, SW, w_scale,
    HI: tl.constexpr, DI: tl.constexpr, BDI: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr,
    HAS_W: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """`_indexer_kernel`'s U32 keys of one query row per sequence (a decode step: its last query,
    t = Tq − 1), the index heads as the columns of one dot: program (key block, b) scores BN keys
    against every head at once, `[BN, DI] · [DI, BH]`, instead of a 64-row query tile (63 rows of
    padding) and one dot a head. The heads are summed in `_indexer_kernel`'s order (head 0 first,
    each column taken exactly); the dots themselves round as their own shape sums, so a score may
    differ from the chunk kernel's in its last bit (as the split attention's output differs from
    one program's)."""
    i_n, b = tl.program_id(0), tl.program_id(1)
    keys = i_n * BN + tl.arange(0, BN)
    offs, h = tl.arange(0, BDI), tl.arange(0, BH)
    k = tl.load(
        KI + (b.to(tl.int64) * Tk + keys)[:, None] * DI + offs[None, :],
        mask=(keys < Tk)[:, None] & (offs[None, :] < DI),
        other=0.0,
    )
    row = (b * Tq + Tq - 1).to(tl.int64)
    in_h = (h < HI)[None, :] & (offs[:, None] < DI)
    qt = tl.load(QI + (row * HI + h)[None, :] * DI + offs[:, None], mask=in_h, other=0.0)
    dots = tl.maximum(mm(k, qt, DOT_PREC) * idx_scale, 0.0)
    if HAS_W:
        w = tl.load(WI + row * SW + h, mask=h < HI, other=0.0).to(tl.float32)
        dots = dots * cast(w * w_scale, WI.dtype.element_ty).to(tl.float32)[None, :]
    score = tl.zeros([BN], dtype=tl.float32)
    for j in tl.static_range(HI):
        score += tl.sum(tl.where(h[None, :] == j, dots, 0.0), 1)
    tl.store(KEYS + b.to(tl.int64) * KW + keys, _u32_keys(score), mask=keys < KW)


def _score_rows(q_idx, k_idx, w, keys, idx_scale: float, sw: int, w_scale: float) -> None:
    """`_indexer_row_kernel` into keys `[B, 1, KW]`: each sequence's last query against its keys."""
    B, Tq, HI, DI = q_idx.shape
    Tk, KW = k_idx.shape[1], keys.shape[-1]
    BN = 16 if triton_interpreting() else 128
    _indexer_row_kernel[(triton.cdiv(KW, BN), B)](
        q_idx, k_idx, q_idx if w is None else w, keys, Tq, Tk, KW, idx_scale, sw, float(w_scale),
        HI=HI, DI=DI, BDI=pow2(DI), BH=pow2(HI), BN=BN, HAS_W=w is not None,
        DOT_PREC=dot_precision(q_idx.dtype), num_warps=1 if triton_interpreting() else 4,
    )  # fmt: skip


def dsa_indexer_triton(
    q_idx,
    k_idx,
    w_idx=None,
    *,
    topk: int,
    idx_scale=None,
    chunk: int | None = None,
    ordered: bool = True,
    positions: torch.Tensor | None = None,
    w_scale: float = 1.0,
):
    """Triton `dsa_indexer`: `[B, Tq, topk]` key indices, rank order, −1 padded (as the reference),
    of the weights `w_idx · w_scale` (the product rounded to w_idx's dtype).

    `ordered=False` returns the same set per query, by the radix selection: index order, −1 pads
    last (what the sparse attention takes). `positions` `[B]` (decode over a static buffer, Tq = 1,
    `ordered=False`): row b's query sits at positions[b], its keys are slots 0 … positions[b]."""
    B, Tq, HI, DI = q_idx.shape
    Tk = k_idx.shape[1]
    if positions is not None and (Tq != 1 or ordered):
        raise ValueError("per-row positions take one query per row (Tq = 1) and ordered=False")
    check_triton_dtype(q_idx)
    idx_scale = DI**-0.5 if idx_scale is None else float(idx_scale)
    q_idx, k_idx = q_idx.contiguous(), k_idx.to(q_idx.dtype).contiguous()
    w = None if w_idx is None else w_idx.reshape(B * Tq, HI)
    if w is not None and w.stride(-1) != 1:
        w = w.contiguous()
    sw = w.stride(0) if w is not None and B * Tq > 1 else HI
    BM, BN = (16, 16) if triton_interpreting() else (64, 128)
    radix = not ordered
    if chunk is None:  # the key buffer near 1 GiB: 2^27 int64 keys or 2^28 unsigned 32-bit ones
        chunk = max(BM, min(Tq, (2 ** (28 if radix else 27) // max(B * Tk, 1)) // BM * BM))
    out = torch.empty(B, Tq, topk, dtype=torch.long, device=q_idx.device)
    kk = min(topk, Tk)
    if positions is None:  # at positions, the selection writes its own pads
        out.fill_(-1)
    for t0 in range(0, Tq, chunk):
        c = min(chunk, Tq - t0)
        # Causal: no row of this chunk sees a key past its last row's position, so the keys and
        # the top-k stop there (half the selection work of a prefill, on average).
        kw = max(1, min(Tk, t0 + c + (Tk - Tq)))
        keys = torch.empty(B, c, kw, dtype=torch.int32 if radix else torch.int64, device=q_idx.device)
        if positions is not None:
            _score_rows(q_idx, k_idx, w, keys, idx_scale, sw, w_scale)
            select_topk(keys, out, t0, Tk, topk, positions)
            continue
        _indexer_kernel[(triton.cdiv(c, BM), triton.cdiv(kw, BN), B)](
            q_idx,
            k_idx,
            q_idx if w is None else w,
            keys,
            t0,
            Tq,
            Tk,
            c,
            kw,
            idx_scale,
            sw,
            float(w_scale),
            HI=HI,
            DI=DI,
            BDI=pow2(DI),
            BM=BM,
            BN=BN,
            HAS_W=w is not None,
            DOT_PREC=dot_precision(q_idx.dtype),
            U32=radix,
            num_warps=1 if triton_interpreting() else 8,
            num_stages=1 if triton_interpreting() else 2,
        )
        if radix:
            select_topk(keys, out, t0, Tk, topk, positions)
            continue
        kc = min(kk, kw)
        top, idx = torch.topk(keys, kc, dim=-1)
        out[:, t0 : t0 + c, :kc] = idx.masked_fill(top == _INT64_MIN, -1)
    return out
