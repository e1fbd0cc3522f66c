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


def select_topk(
    keys: torch.Tensor, out: torch.Tensor, t0: int, Tk: int, topk: int, positions: torch.Tensor | None = None
) -> None:
    """Fill out[:, t0 : t0 + C] (`[B, Tq, topk]` int64, pre-filled with −1) from the chunk's
    ordered keys `[B, C, KW]` (int32 storage of the unsigned keys), index order; `positions` `[B]`
    (Tq = 1): each row's query position, keys past it not candidates, and `out` needs no pre-fill
    (the kernel writes the −1 pads). Few long rows (`use_split`) take the sliced select
    (`select_topk_split`, 5 launches), the rest one program a row (1 launch); the same output."""
    B, C, KW = keys.shape
    if use_split(B * C, KW):
        select_topk_split(keys, out, t0, Tk, topk, positions)
    else:
        _select_single(keys, out, t0, Tk, topk, positions)
