"""Exact causal top-k of the index scores by a radix select per query row, as a set (`ordered=False`).

The rank-ordered selection sorts `[B, chunk, Tk]` int64 keys (score, then the lower index) with
`torch.topk`: 78 of the indexer's 86 ms at B=4, T=32k, 4 index heads of 128, top-k 2048 on the
H200 (the scores alone: 7.5 ms). Here the score kernel writes each score once as a 32-bit
unsigned key (`ordered(I)`: unsigned order = float order) and one program per query row finds the
k-th largest key by four histogram passes over its 8-bit digits (`tl.histogram`, masked to the keys
that share the digits found so far), then writes the selected indices in index order: every key
above the threshold, and of the keys equal to it the lowest indices first, so the selected set is
exactly the reference's (largest score, then the lower index: `common.attn_utils.rank_keys`). A
row reads only its causal prefix (keys s ≤ its position), 4 bytes a key per pass.

Passes are 8 bits wide because a 2048-bin `tl.histogram` pass runs ~10× slower than a 256-bin one
on the GPU (12.7 against 1.5 ms over 2 GB of keys). With four 8-bit passes the select takes 59.0 ms
against 74.0 for `torch.topk` (sorted=False) over the int64 keys, the same sets (H200). Rank order
(what `dsa_indexer` and `dsa(..., return_indices=True)` return) stays with `torch.topk`: the radix
select followed by a sort of its k entries took 90.8 ms against 86.4.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import triton_interpreting


@triton.jit
def _digit_histogram(KEYS, n, SHIFT: tl.constexpr, WIDTH: tl.constexpr, prefix, HAS_PREFIX: tl.constexpr,
                     BLK: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """Histogram `[NB]` of the digit (key >> SHIFT) & (2^WIDTH − 1) over keys[0:n] whose bits above
    SHIFT + WIDTH equal `prefix`."""
    hist = tl.zeros([NB], dtype=tl.int32)
    offs = tl.arange(0, BLK)
    for s0 in range(0, n, BLK):
        m = s0 + offs < n
        key = tl.load(KEYS + s0 + offs, mask=m, other=0).to(tl.uint32, bitcast=True)
        if HAS_PREFIX:
            m = m & ((key >> (SHIFT + WIDTH)) == prefix)
        digit = ((key >> SHIFT) & ((1 << WIDTH) - 1)).to(tl.int32)
        hist += tl.histogram(digit, NB, mask=m)
    return hist


@triton.jit
def _pick(hist, rem, NB: tl.constexpr):
    """(b, above): the bin holding the rem-th largest key (rem ≥ 1) and how many keys lie above it."""
    bins = tl.arange(0, NB)
    at_or_above = tl.cumsum(hist, 0, reverse=True)
    b = tl.max(tl.where(at_or_above >= rem, bins, -1), 0)
    above = tl.sum(tl.where(bins == b, at_or_above - hist, 0), 0)
    return b, above


@triton.jit
def _select_kernel(
    KEYS,
    OUT,
    POS,
    t0,
    Tq,
    Tk,
    C,
    KW,
    K,
    BLK: tl.constexpr,
    HAS_POS: tl.constexpr,
):
    """OUT[b, t0 + r, :] for chunk row r: the indices of the top-K keys among KEYS[b, r, 0:n],
    n = min(pos + 1, KW), in index order; −1 past the count (OUT is filled with −1 beforehand,
    except with HAS_POS, where the kernel writes them). pos: the row's query position,
    t0 + r + Tk − Tq, or with HAS_POS (one query per sequence over a static buffer) POS[b]."""
    r, b = tl.program_id(0), tl.program_id(1)
    t = t0 + r
    if HAS_POS:
        pos = tl.load(POS + b).to(tl.int32)
    else:
        pos = t + (Tk - Tq)
    n = tl.minimum(pos + 1, KW)
    keys = KEYS + (b.to(tl.int64) * C + r) * KW
    out = OUT + (b.to(tl.int64) * Tq + t) * K
    # the threshold key thr and how many keys equal to it are taken (rem); with n ≤ K every key is
    thr = tl.zeros([], dtype=tl.uint32)
    rem = n
    if n > K:
        # 8-bit digits: on the H200 a 256-bin tl.histogram pass runs at ~1.3 TB/s of keys, a
        # 2048-bin one ~10x slower (bench/dsa_radix.py's first run took 313 ms with 11-bit digits)
        h = _digit_histogram(keys, n, 24, 8, 0, False, BLK, 256)
        d, above = _pick(h, K, 256)
        rem = K - above
        p = d.to(tl.uint32)
        h = _digit_histogram(keys, n, 16, 8, p, True, BLK, 256)
        d, above = _pick(h, rem, 256)
        rem = rem - above
        p = (p << 8) | d.to(tl.uint32)
        h = _digit_histogram(keys, n, 8, 8, p, True, BLK, 256)
        d, above = _pick(h, rem, 256)
        rem = rem - above
        p = (p << 8) | d.to(tl.uint32)
        h = _digit_histogram(keys, n, 0, 8, p, True, BLK, 256)
        d, above = _pick(h, rem, 256)
        rem = rem - above
        thr = (p << 8) | d.to(tl.uint32)
    offs = tl.arange(0, BLK)
    n_sel = tl.zeros([], dtype=tl.int32)
    n_eq = tl.zeros([], dtype=tl.int32)
    for s0 in range(0, n, BLK):
        s = s0 + offs
        m = s < n
        key = tl.load(keys + s, mask=m, other=0).to(tl.uint32, bitcast=True)
        eq = (m & (key == thr)).to(tl.int32)
        eq_before = n_eq + tl.cumsum(eq, 0) - eq
        sel = (m & ((key > thr) | ((eq > 0) & (eq_before < rem)))).to(tl.int32)
        slot = n_sel + tl.cumsum(sel, 0) - sel
        tl.store(out + slot, s.to(tl.int64), mask=(sel > 0) & (slot < K))
        n_sel += tl.sum(sel, 0)
        n_eq += tl.sum(eq, 0)
    if HAS_POS:
        # OUT is not pre-filled here: the row's slots past its selection take the −1 pads
        for k0 in range(0, K, BLK):
            slot = k0 + offs
            tl.store(out + slot, tl.full([BLK], -1, tl.int64), mask=(slot >= n_sel) & (slot < K))


def select_topk(
    keys: torch.Tensor, out: torch.Tensor, t0: int, Tk: int, topk: int, positions: torch.Tensor | None = None
) -> None:
    """Fill out[:, t0 : t0 + C] (`[B, Tq, topk]` int64, pre-filled with −1) from the chunk's
    ordered keys `[B, C, KW]` (int32 storage of the unsigned keys), index order; `positions` `[B]`
    (Tq = 1): each row's query position, keys past it not candidates, and `out` needs no pre-fill
    (the kernel writes the −1 pads)."""
    B, C, KW = keys.shape
    Tq = out.shape[1]
    interp = triton_interpreting()
    _select_kernel[(C, B)](
        keys, out, out if positions is None else positions, t0, Tq, Tk, C, KW, topk,
        BLK=64 if interp else 2048, HAS_POS=positions is not None, num_warps=1 if interp else 4,
    )  # fmt: skip
