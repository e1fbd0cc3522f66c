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

A decode step has one query row per sequence (grid (1, B)): one program would scan a row of up to
KW keys five times while the other SMs idle. Few long rows (`use_split`) take the sliced select
instead (`select_topk_split`): the same passes over (slice, row) programs, each pass one launch that
merges the slices' digit histograms through a small per-row scratch, then a write launch that
places each slice's selections after those of the slices before it; five launches, same output.

Two more selects give the same output with no histogram (`bench/dsa_decode_select.py` times them
against these two on the card):

* `select_topk_rows` (one launch): a row held in registers as one tile; the threshold by
  bisection, one bit at a time from the top (32 counts of the keys at or above a prefix: block
  reductions over registers, where a digit histogram pass is a chain of shared-memory updates);
* `select_topk_merge` (two launches): each slice of MERGE_SLICE_KEYS takes its own top k the same
  way (the row's top k is among its slices' top k, as the order is one order: score, then lower
  index), then one program a row bisects the slices' candidates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import triton_interpreting

# the split path: rows (C·B) at most this, rows of at least this many keys; programs it aims at
# (about two per SM of an H100), slices per row at most. Slices are multiples of SLICE_KEYS keys,
# of SHORT_SLICE_KEYS in rows shorter than SHORT_BELOW. H100, a decode step's select under a CUDA
# graph (`bench/dsa_decode_select.py`): at 4,160 slots one program a row takes 29.4 µs (three
# 2048-key blocks a pass), 2048-key slices 22.0, 512-key slices 17.4; at 4,096, 20.7 against 17.1.
SPLIT_MAX_ROWS = 128
SPLIT_MIN_KW = 4096
SPLIT_PROGRAMS = 256
MAX_SLICES = 64
SLICE_KEYS = 2048
SHORT_SLICE_KEYS = 512
SHORT_BELOW = 8192
# the bisection selects: warps a program, keys a slice of `select_topk_merge`. sm_90: a row of
# 8,192 keys takes 255 registers a thread and spills 32 B at 8 warps, 121 and none at 16; a merge
# of 8,192 candidates none at 8 (up to 229), 24-40 B at 16 (a thread's 128 registers at most);
# 16 slices' top 2048 spills 2-3 KB at 8
ROW_WARPS = 16
MERGE_WARPS = 8
MERGE_SLICE_KEYS = 4096
MAX_TILE_KEYS = 16384


@triton.jit
def _digit_histogram(KEYS, lo, hi, SHIFT: tl.constexpr, WIDTH: tl.constexpr, prefix, HAS_PREFIX: tl.constexpr,
                     BLK: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """(hist, above): the histogram `[NB]` of the digit (key >> SHIFT) & (2^WIDTH − 1) over
    keys[lo:hi] whose bits above SHIFT + WIDTH equal `prefix`, and how many keys' bits there exceed it."""
    hist = tl.zeros([NB], dtype=tl.int32)
    above = tl.zeros([], dtype=tl.int32)
    offs = tl.arange(0, BLK)
    for s0 in range(lo, hi, BLK):
        m = s0 + offs < hi
        key = tl.load(KEYS + s0 + offs, mask=m, other=0).to(tl.uint32, bitcast=True)
        if HAS_PREFIX:
            high = key >> (SHIFT + WIDTH)
            above += tl.sum((m & (high > prefix)).to(tl.int32), 0)
            m = m & (high == prefix)
        digit = ((key >> SHIFT) & ((1 << WIDTH) - 1)).to(tl.int32)
        hist += tl.histogram(digit, NB, mask=m)
    return hist, above


@triton.jit
def _pick(hist, rem, NB: tl.constexpr):
    """(b, above): the bin holding the rem-th largest key (rem ≥ 1) and how many keys lie above it."""
    bins = tl.arange(0, NB)
    at_or_above = tl.cumsum(hist, 0, reverse=True)
    b = tl.max(tl.where(at_or_above >= rem, bins, -1), 0)
    above = tl.sum(tl.where(bins == b, at_or_above - hist, 0), 0)
    return b, above


@triton.jit
def _row_length(POS, b, t, Tq, Tk, KW, HAS_POS: tl.constexpr):
    """n = min(pos + 1, KW): the candidates of the row whose query sits at pos, t + Tk − Tq (causal
    chunk row t), or with HAS_POS (one query per sequence over a static buffer) POS[b]."""
    if HAS_POS:
        pos = tl.load(POS + b).to(tl.int32)
    else:
        pos = t + (Tk - Tq)
    return tl.minimum(pos + 1, KW)


@triton.jit
def _write_range(keys, out, lo, hi, thr, rem, n_sel, n_eq, K, BLK: tl.constexpr):
    """Write the selected indices among keys[lo:hi] in index order from out[n_sel]: every key above
    thr, and the keys equal to it while fewer than rem came before (n_eq of them before lo)."""
    offs = tl.arange(0, BLK)
    for s0 in range(lo, hi, BLK):
        s = s0 + offs
        m = s < hi
        key = tl.load(keys + s, mask=m, other=0).to(tl.uint32, bitcast=True)
        eq = (m & (key == thr)).to(tl.int32)
        eq_before = n_eq + tl.cumsum(eq, 0) - eq
        sel = (m & ((key > thr) | ((eq > 0) & (eq_before < rem)))).to(tl.int32)
        slot = n_sel + tl.cumsum(sel, 0) - sel
        tl.store(out + slot, s.to(tl.int64), mask=(sel > 0) & (slot < K))
        n_sel += tl.sum(sel, 0)
        n_eq += tl.sum(eq, 0)
    return n_sel


@triton.jit
def _write_pads(out, start, K, BLK: tl.constexpr):
    """−1 into out[start:K], the slots past a row's selection."""
    offs = tl.arange(0, BLK)
    for k0 in range(0, K, BLK):
        slot = k0 + offs
        tl.store(out + slot, tl.full([BLK], -1, tl.int64), mask=(slot >= start) & (slot < K))


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
    """OUT[b, t0 + r, :] for chunk row r: the indices of the top-K keys among KEYS[b, r, 0:n]
    (`_row_length`), in index order; −1 past the count (OUT is filled with −1 beforehand, except
    with HAS_POS, where the kernel writes them). One program scans its row five times."""
    r, b = tl.program_id(0), tl.program_id(1)
    t = t0 + r
    n = _row_length(POS, b, t, Tq, Tk, KW, HAS_POS)
    keys = KEYS + (b.to(tl.int64) * C + r) * KW
    out = OUT + (b.to(tl.int64) * Tq + t) * K
    # the threshold key thr and how many keys equal to it are taken (rem); with n ≤ K every key is
    thr = tl.zeros([], dtype=tl.uint32)
    rem = n
    if n > K:
        # 8-bit digits: on the H200 a 256-bin tl.histogram pass runs at ~1.3 TB/s of keys, a
        # 2048-bin one ~10x slower (bench/dsa_radix.py's first run took 313 ms with 11-bit digits)
        h, _ = _digit_histogram(keys, 0, n, 24, 8, 0, False, BLK, 256)
        d, above = _pick(h, K, 256)
        rem = K - above
        p = d.to(tl.uint32)
        h, _ = _digit_histogram(keys, 0, n, 16, 8, p, True, BLK, 256)
        d, above = _pick(h, rem, 256)
        rem = rem - above
        p = (p << 8) | d.to(tl.uint32)
        h, _ = _digit_histogram(keys, 0, n, 8, 8, p, True, BLK, 256)
        d, above = _pick(h, rem, 256)
        rem = rem - above
        p = (p << 8) | d.to(tl.uint32)
        h, _ = _digit_histogram(keys, 0, n, 0, 8, p, True, BLK, 256)
        d, above = _pick(h, rem, 256)
        rem = rem - above
        thr = (p << 8) | d.to(tl.uint32)
    zero = tl.zeros([], dtype=tl.int32)
    n_sel = _write_range(keys, out, 0, n, thr, rem, zero, zero, K, BLK)
    if HAS_POS:
        # OUT is not pre-filled here: the row's slots past its selection take the −1 pads
        _write_pads(out, n_sel, K, BLK)


@triton.jit
def _sum_slices(PART, ns, SB: tl.constexpr):
    """The sum of the histograms PART[i, 0:256] (rows of 257) over slices i = 0 … ns−1."""
    rows, bins = tl.arange(0, SB), tl.arange(0, 256)
    acc = tl.zeros([256], dtype=tl.int32)
    for i0 in range(0, ns, SB):
        i = i0 + rows
        acc += tl.sum(tl.load(PART + i[:, None] * 257 + bins[None, :], mask=(i < ns)[:, None], other=0), 0)
    return acc


@triton.jit
def _descend(G, NPASS: tl.constexpr, K):
    """(p, rem): the top 8·NPASS bits p of a row's K-th largest key, from its first NPASS digit
    histograms G[q, 256] (pass q counts the keys sharing the q digits above), and how many keys
    sharing p are taken."""
    bins = tl.arange(0, 256)
    p = tl.zeros([], dtype=tl.uint32)
    rem = K
    for q in tl.static_range(NPASS):
        d, above = _pick(tl.load(G + q * 256 + bins), rem, 256)
        rem = rem - above
        p = (p << 8) | d.to(tl.uint32)
    return p, rem


@triton.jit
def _taken_before(PART, j, d):
    """(above, eq): over slices i = 0 … j−1, the keys above the threshold (top 24 bits p, low digit
    d) and equal to it, from PART[i, b] = the slice's keys ≥ p·256 + b (b = 0 … 256)."""
    offs = tl.arange(0, 128)
    above = tl.zeros([], dtype=tl.int32)
    eq = tl.zeros([], dtype=tl.int32)
    for i0 in range(0, j, 128):
        i = i0 + offs
        ge = tl.load(PART + i * 257 + d, mask=i < j, other=0)
        gt = tl.load(PART + i * 257 + d + 1, mask=i < j, other=0)
        above += tl.sum(gt, 0)
        eq += tl.sum(ge - gt, 0)
    return above, eq


@triton.jit
def _split_pass_kernel(KEYS, POS, PART, G, t0, Tq, Tk, C, KW, K, SL, PASS: tl.constexpr, BLK: tl.constexpr,
                       SB: tl.constexpr, HAS_POS: tl.constexpr):  # fmt: skip
    """Pass PASS (0 … 3) of the radix select over key slice j = keys[j·SL : (j+1)·SL] of chunk row r
    of sequence b (grid (S, C, B)); rows with n ≤ K and slices past n exit at once. Row scratch:
    G[4, 256] the row's digit histograms, PART[S, 257] per-slice counts.
    Pass 0 stores the slice's top-digit histogram in PART (no atomics: nothing is zeroed yet) and
    slice 0 zeroes G[1:4]; pass 1 sums PART into the row's G[0] (slice 0 stores it) and adds its
    slice's next-digit histogram into G[1]; pass q ≥ 2 reads the prefix p from G[0:q] and adds into
    G[q]; pass 3 also stores PART[j, b] = its slice's keys ≥ p·256 + b, for `_taken_before`."""
    j, r, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    S = tl.num_programs(0)
    n = _row_length(POS, b, t0 + r, Tq, Tk, KW, HAS_POS)
    lo = j * SL
    if (n > K) & (lo < n):
        row = b.to(tl.int64) * C + r
        keys = KEYS + row * KW
        g = G + row * 1024
        part = PART + (row * S + j) * 257
        hi = tl.minimum(lo + SL, n)
        bins = tl.arange(0, 256)
        if PASS == 0:
            h, _ = _digit_histogram(keys, lo, hi, 24, 8, 0, False, BLK, 256)
            tl.store(part + bins, h)
            if j == 0:
                for q in tl.static_range(1, 4):
                    tl.store(g + q * 256 + bins, tl.zeros([256], dtype=tl.int32))
        elif PASS == 1:
            h0 = _sum_slices(PART + row * S * 257, tl.cdiv(n, SL), SB)
            if j == 0:
                tl.store(g + bins, h0)
            d, _ = _pick(h0, K, 256)
            h, _ = _digit_histogram(keys, lo, hi, 16, 8, d.to(tl.uint32), True, BLK, 256)
            tl.atomic_add(g + 256 + bins, h, sem="relaxed")
        else:
            p, _ = _descend(g, PASS, K)
            h, above = _digit_histogram(keys, lo, hi, 24 - 8 * PASS, 8, p, True, BLK, 256)
            tl.atomic_add(g + PASS * 256 + bins, h, sem="relaxed")
            if PASS == 3:
                tl.store(part + bins, above + tl.cumsum(h, 0, reverse=True))
                tl.store(part + 256, above)


@triton.jit
def _split_write_kernel(KEYS, OUT, POS, PART, G, t0, Tq, Tk, C, KW, K, SL, BLK: tl.constexpr,
                        SB: tl.constexpr, HAS_POS: tl.constexpr):  # fmt: skip
    """The selection of slice j after `_split_pass_kernel`'s four passes: its indices go to the
    row's out from the count its earlier slices take (`_taken_before`; with n ≤ K every key: j·SL);
    slice 0 writes the row's −1 pads."""
    j, r, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    S = tl.num_programs(0)
    t = t0 + r
    n = _row_length(POS, b, t, Tq, Tk, KW, HAS_POS)
    lo = j * SL
    if lo < n:
        row = b.to(tl.int64) * C + r
        out = OUT + (b.to(tl.int64) * Tq + t) * K
        thr = tl.zeros([], dtype=tl.uint32)
        rem = n
        n_sel = lo
        n_eq = tl.zeros([], dtype=tl.int32)
        if n > K:
            thr, rem = _descend(G + row * 1024, 4, K)
            n_sel, n_eq = _taken_before(PART + row * S * 257, j, (thr & 255).to(tl.int32))
            n_sel += tl.minimum(n_eq, rem)
        _write_range(KEYS + row * KW, out, lo, tl.minimum(lo + SL, n), thr, rem, n_sel, n_eq, K, BLK)
        if j == 0:
            _write_pads(out, tl.minimum(n, K), K, BLK)


@triton.jit
def _count(key, at_least):
    """How many keys of the 2-D tile are ≥ at_least (unsigned, at_least ≥ 1, so the tile's padding,
    loaded as 0, never counts). Down the tile's rows first: a thread holds one column's rows, so
    that sum is in its registers and one block reduction remains (across the rows first: one a row)."""
    return tl.sum(tl.sum((key >= at_least).to(tl.int32), 0), 0)


@triton.jit
def _bisect(key, K):
    """(thr, rem) of a 2-D tile of unsigned keys, its padding 0: thr the K-th largest key, built
    from the top bit down (a bit stays set iff at least K keys are ≥ the prefix with it), rem = K −
    the keys above thr, how many keys equal to it are taken. With fewer than K keys above 0, thr = 0
    and rem covers every key. One count a bit: the tile stays in registers, 32 reductions and no
    histogram."""
    p = tl.zeros([], dtype=tl.uint32)
    bit = tl.full([], 1 << 31, dtype=tl.uint32)
    for _ in range(32):
        cand = p | bit
        p = tl.where(_count(key, cand) >= K, cand, p)
        bit = bit >> 1
    return p, K - tl.sum(tl.sum((key > p).to(tl.int32), 0), 0)


@triton.jit
def _slots(key, valid, thr, rem):
    """(sel, slot, n_sel) of a 2-D tile read row-major in index order: sel the taken keys (every key
    above thr, of those equal to it the first rem), slot each one's place among them, n_sel their
    count (at most K of any valid thr, rem; the stores mask slot < K all the same, so no input
    writes out of bounds). Cumulative sums along the rows plus each row's offset: no reshape."""
    eq = (valid & (key == thr)).to(tl.int32)
    eq_row = tl.sum(eq, 1)
    eq_before = (tl.cumsum(eq_row, 0) - eq_row)[:, None] + tl.cumsum(eq, 1) - eq
    sel = (valid & ((key > thr) | ((eq > 0) & (eq_before < rem)))).to(tl.int32)
    sel_row = tl.sum(sel, 1)
    slot = (tl.cumsum(sel_row, 0) - sel_row)[:, None] + tl.cumsum(sel, 1) - sel
    return sel > 0, slot, tl.sum(sel_row, 0)


@triton.jit
def _select_tile(key, valid, n, K):
    """(sel, slot, n_sel) of the top K of a tile's n valid keys (`_slots`): every key where n ≤ K,
    else those at or above `_bisect`'s threshold."""
    thr = tl.zeros([], dtype=tl.uint32)
    rem = n
    if n > K:
        thr, rem = _bisect(key, K)
    return _slots(key, valid, thr, rem)


@triton.jit
def _row_bisect_kernel(KEYS, OUT, POS, t0, Tq, Tk, C, KW, K, R: tl.constexpr, W: tl.constexpr,
                       PB: tl.constexpr, HAS_POS: tl.constexpr):  # fmt: skip
    """`_select_kernel`'s output with the row's keys (at most R·W) held in registers as an
    `[R, W]` tile (`_select_tile`); one program a row."""
    r, b = tl.program_id(0), tl.program_id(1)
    t = t0 + r
    n = _row_length(POS, b, t, Tq, Tk, KW, HAS_POS)
    s = tl.arange(0, R)[:, None] * W + tl.arange(0, W)[None, :]
    valid = s < n
    key = tl.load(KEYS + (b.to(tl.int64) * C + r) * KW + s, mask=valid, other=0).to(tl.uint32, bitcast=True)
    out = OUT + (b.to(tl.int64) * Tq + t) * K
    sel, slot, n_sel = _select_tile(key, valid, n, K)
    tl.store(out + slot, s.to(tl.int64), mask=sel & (slot < K))
    if HAS_POS:
        _write_pads(out, n_sel, K, PB)


@triton.jit
def _slice_bisect_kernel(KEYS, POS, CK, CI, CNT, t0, Tq, Tk, C, KW, K, SL, R: tl.constexpr, W: tl.constexpr,
                         HAS_POS: tl.constexpr):  # fmt: skip
    """Slice j = keys[j·SL : (j+1)·SL] of chunk row r of sequence b (grid (S, C, B)): its own top K
    (the row's top K under (key, then lower index) lies in the union of its slices' top K), keys
    and indices in index order to CK, CI `[rows, S, K]` and their count to CNT `[rows, S]`. Slices
    past the row's n exit; `_merge_bisect_kernel` reads none of theirs."""
    j, r, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    S = tl.num_programs(0)
    n = _row_length(POS, b, t0 + r, Tq, Tk, KW, HAS_POS)
    lo = j * SL
    if lo < n:
        row = b.to(tl.int64) * C + r
        s = lo + tl.arange(0, R)[:, None] * W + tl.arange(0, W)[None, :]
        valid = s < tl.minimum(lo + SL, n)
        key = tl.load(KEYS + row * KW + s, mask=valid, other=0).to(tl.uint32, bitcast=True)
        sel, slot, n_sel = _select_tile(key, valid, tl.minimum(lo + SL, n) - lo, K)
        base = (row * S + j) * K
        tl.store(CK + base + slot, key.to(tl.int32, bitcast=True), mask=sel & (slot < K))
        tl.store(CI + base + slot, s, mask=sel & (slot < K))
        tl.store(CNT + row * S + j, tl.minimum(n_sel, K))


@triton.jit
def _merge_bisect_kernel(CK, CI, CNT, OUT, POS, t0, Tq, Tk, C, KW, K, SL, S, SB: tl.constexpr,
                         KP: tl.constexpr, PB: tl.constexpr, HAS_POS: tl.constexpr):  # fmt: skip
    """The row's top K from its slices' candidates (`_slice_bisect_kernel`) as an `[SB, KP]` tile
    (slice, rank), read in slice order, so in index order; one program a row."""
    r, b = tl.program_id(0), tl.program_id(1)
    t = t0 + r
    n = _row_length(POS, b, t, Tq, Tk, KW, HAS_POS)
    row = b.to(tl.int64) * C + r
    j = tl.arange(0, SB)
    live = (j < S) & (j * SL < n)
    cnt = tl.load(CNT + row * S + j, mask=live, other=0)
    at = (row * S + j)[:, None] * K + tl.arange(0, KP)[None, :]
    valid = tl.arange(0, KP)[None, :] < cnt[:, None]
    key = tl.load(CK + at, mask=valid, other=0).to(tl.uint32, bitcast=True)
    idx = tl.load(CI + at, mask=valid, other=0)
    out = OUT + (b.to(tl.int64) * Tq + t) * K
    sel, slot, n_sel = _select_tile(key, valid, tl.sum(cnt, 0), K)
    tl.store(out + slot, idx.to(tl.int64), mask=sel & (slot < K))
    if HAS_POS:
        _write_pads(out, n_sel, K, PB)


def _tile(keys: int) -> tuple[int, int]:
    """(R, W): a power-of-two `[R, W]` tile of at least `keys` slots, rows of at most 1024."""
    W = min(triton.next_power_of_2(max(keys, 1)), 1024)
    return triton.next_power_of_2(triton.cdiv(max(keys, 1), W)), W


def _check_tile(what: str, keys: int) -> None:
    """A register tile of at most MAX_TILE_KEYS keys (past it every thread spills kilobytes)."""
    if keys > MAX_TILE_KEYS:
        raise ValueError(f"{what} needs a register tile of {keys:,} keys; at most {MAX_TILE_KEYS:,}")


def select_topk_rows(keys, out, t0, Tk, topk, positions=None, *, num_warps: int | None = None) -> None:
    """`select_topk` by one program a row holding the row's KW keys in registers
    (`_row_bisect_kernel`, one launch): rows of at most 8,192 slots at ROW_WARPS spill nothing."""
    B, C, KW = keys.shape
    R, W = _tile(KW)
    _check_tile("select_topk_rows: a row of KW keys", R * W)
    interp = triton_interpreting()
    _row_bisect_kernel[(C, B)](
        keys, out, out if positions is None else positions, t0, out.shape[1], Tk, C, KW, topk, R=R, W=W,
        PB=min(triton.next_power_of_2(topk), 1024), HAS_POS=positions is not None,
        num_warps=1 if interp else num_warps or ROW_WARPS,
    )  # fmt: skip


def merge_scratch(rows: int, S: int, topk: int, like: torch.Tensor) -> torch.Tensor:
    """`select_topk_merge`'s int32 scratch, uninitialised: each slice's candidate keys and indices
    `[rows, S, topk]` and counts `[rows, S]`."""
    return torch.empty(rows * S * (2 * topk + 1), dtype=torch.int32, device=like.device)


def select_topk_merge(keys, out, t0, Tk, topk, positions=None, *, slice_len: int | None = None,
                      num_warps: int | None = None, scratch=None) -> None:  # fmt: skip
    """`select_topk` in two launches: each slice of `slice_len` keys (MERGE_SLICE_KEYS by default)
    takes its own top k in registers, one program a (slice, row), then one program a row takes the
    top k of its slices' candidates (`_slice_bisect_kernel`, `_merge_bisect_kernel`). `scratch`
    (at least `merge_scratch`'s size) is allocated here when None; nothing unwritten is read."""
    B, C, KW = keys.shape
    SL = min(KW, slice_len or MERGE_SLICE_KEYS)
    S, rows = triton.cdiv(KW, SL), B * C
    R, W = _tile(SL)
    _check_tile("select_topk_merge: a slice", R * W)
    SB, KP = triton.next_power_of_2(S), triton.next_power_of_2(topk)
    _check_tile("select_topk_merge: the slices' candidates", SB * KP)
    if scratch is None:
        scratch = merge_scratch(rows, S, topk, keys)
    n = rows * S * topk
    ck, ci, cnt = scratch[:n], scratch[n : 2 * n], scratch[2 * n : 2 * n + rows * S]
    interp = triton_interpreting()
    warps = 1 if interp else num_warps or MERGE_WARPS
    pos = out if positions is None else positions
    _slice_bisect_kernel[(S, C, B)](
        keys, pos, ck, ci, cnt, t0, out.shape[1], Tk, C, KW, topk, SL, R=R, W=W,
        HAS_POS=positions is not None, num_warps=warps,
    )  # fmt: skip
    _merge_bisect_kernel[(C, B)](
        ck, ci, cnt, out, pos, t0, out.shape[1], Tk, C, KW, topk, SL, S, SB=SB, KP=KP, PB=min(KP, 1024),
        HAS_POS=positions is not None, num_warps=warps,
    )  # fmt: skip


def use_split(rows: int, KW: int) -> bool:
    """Whether `select_topk` splits each row's keys over programs: fewer rows (a decode step's B, a
    short chunk) than SPLIT_MAX_ROWS, where one program a row would leave SMs idle, of at least
    SPLIT_MIN_KW keys. Shapes only."""
    return rows <= SPLIT_MAX_ROWS and KW >= SPLIT_MIN_KW


def split_slices(KW: int, rows: int, slice_len: int | None = None) -> tuple[int, int]:
    """(SL, S): keys per slice and slices per row. By default SL is a multiple of SLICE_KEYS
    (SHORT_SLICE_KEYS in rows of fewer than SHORT_BELOW keys) and S about SPLIT_PROGRAMS / rows (at
    most MAX_SLICES): enough programs to fill the GPU, few slices for the per-slice counts every
    program of a row reads."""
    if slice_len is None:
        target = max(1, min(MAX_SLICES, SPLIT_PROGRAMS // max(rows, 1)))
        unit = SHORT_SLICE_KEYS if KW < SHORT_BELOW else SLICE_KEYS
        slice_len = unit * triton.cdiv(triton.cdiv(KW, unit), target)
    if slice_len < 1:
        raise ValueError(f"slice_len must be positive, got {slice_len}")
    return slice_len, triton.cdiv(KW, slice_len)


def split_scratch(rows: int, S: int, like: torch.Tensor) -> torch.Tensor:
    """The split path's int32 scratch of `rows` key rows of S slices, uninitialised: per row the
    slices' counts [S, 257] and four digit histograms [4, 256]."""
    return torch.empty(rows * (S * 257 + 4 * 256), dtype=torch.int32, device=like.device)


def _select_single(keys, out, t0, Tk, topk, positions) -> None:
    B, C, KW = keys.shape
    interp = triton_interpreting()
    _select_kernel[(C, B)](
        keys, out, out if positions is None else positions, t0, out.shape[1], Tk, C, KW, topk,
        BLK=64 if interp else 2048, HAS_POS=positions is not None, num_warps=1 if interp else 4,
    )  # fmt: skip


def select_topk_split(keys, out, t0, Tk, topk, positions=None, *, slice_len=None, scratch=None) -> None:
    """`select_topk` with each row's keys split into S slices of `slice_len` (`split_slices`), one
    program per (slice, row): four histogram launches and a write launch over the grid (S, C, B),
    the fifth writing −1 pads too. `scratch` (int32, at least `split_scratch`'s size) is the
    kernels' workspace, allocated here when None; they read nothing of it they did not write."""
    B, C, KW = keys.shape
    rows = B * C
    SL, S = split_slices(KW, rows, slice_len)
    if scratch is None:
        scratch = split_scratch(rows, S, keys)
    part, g = scratch[: rows * S * 257], scratch[rows * S * 257 : rows * (S * 257 + 1024)]
    interp = triton_interpreting()
    pos = out if positions is None else positions
    args = (t0, out.shape[1], Tk, C, KW, topk, SL)
    blk = min(triton.next_power_of_2(SL), 64 if interp else 2048)
    cex = dict(BLK=blk, SB=8, HAS_POS=positions is not None, num_warps=1 if interp else 4)
    for p in range(4):
        _split_pass_kernel[(S, C, B)](keys, pos, part, g, *args, PASS=p, **cex)
    _split_write_kernel[(S, C, B)](keys, out, pos, part, g, *args, **cex)


def select_path(rows: int, KW: int, topk: int) -> str:
    """Which select `select_topk` runs (shapes only): few long rows (`use_split`) the sliced
    histogram passes (`split`), the rest one program a row (`single`). `rows` and `merge`
    (`select_topk_rows`, `select_topk_merge`) are called by name."""
    return "split" if use_split(rows, KW) else "single"


def select_topk(
    keys: torch.Tensor, out: torch.Tensor, t0: int, Tk: int, topk: int, positions: torch.Tensor | None = None
) -> None:
    """Fill out[:, t0 : t0 + C] (`[B, Tq, topk]` int64, pre-filled with −1) from the chunk's
    ordered keys `[B, C, KW]` (int32 storage of the unsigned keys), index order; `positions` `[B]`
    (Tq = 1): each row's query position, keys past it not candidates, and `out` needs no pre-fill
    (the kernel writes the −1 pads). The path by `select_path`: 1 or 5 launches, one output."""
    B, C, KW = keys.shape
    if select_path(B * C, KW, topk) == "split":
        select_topk_split(keys, out, t0, Tk, topk, positions)
    else:
        _select_single(keys, out, t0, Tk, topk, positions)
