"""Triton decode step of NSA over static buffers: one query per row at its own position t_b.

What `engine.sparse.nsa_rows` computes (the reference: dense masked attention over every slot),
in work proportional to what a row sees rather than to the buffer:

1. `nsa_decode_select_kernel`, one program per (row, kv head), the group's G query heads as the
   rows of a tile: the compressed branch over the n_vis = ⌊(t + 1 − l)/d⌋ + 1 visible compressed
   keys in two passes (max and sum, then the normalised probabilities p, o_cmp = p · v_cmp), the
   group-mean of p written to a scratch row, the selection-block scores p_slc[j] = Σ_{m<l'/d}
   Σ_{u<l/d} p̄[(l'/d)·j − m − u] read back from it, blocks 0, ⌊t/l'⌋ and the one before forced
   (+inf), blocks after ⌊t/l'⌋ excluded, and the top-n by repeated arg-max (ties to the lower
   block, as `topk_select`); each chosen block's tokens ≤ t are written as key indices (−1 pads),
   then the window's slots t − w + 1 … t, in one index row.
2. `dsa.triton_attn._sparse_split_kernel` over that row, in chunks that never straddle the two
   branches (`attention_splits`): partial o and lse per chunk.
3. `nsa_decode_combine_kernel` merges the chunks per branch by their lse and mixes
   o = g_slc · o_slc + g_cmp · o_cmp + g_swa · o_swa per head in fp32, rounded once.

Where the B·HKV programs are too few to fill the card and the buffer holds many compressed keys
(a long context at small batch: one SM would stream them all twice), step 1 is three launches,
each spread over the context rather than one program's serial loop (whose round trips grow with
it): `nsa_decode_cmp_split_kernel` over splits of the compressed keys (one pass: scores kept in a
scratch row, partial max, sum and o), `nsa_decode_slice_select_kernel` over slices of the
selection blocks (the splits' statistics merged as one tile, the slice's block scores from the
kept scores, its top n by rank), `nsa_decode_choose_kernel` the row's top n among the slices'
(`cmp_splits`); the combine kernel then merges o_cmp from the splits per head. Before them,
`nsa_decode_compress_kernel` (`compress_step`) writes the compression block a row's new token
completes, of k and v in one launch (nothing where none completes, 15 steps in 16 at d = 16).

Three or five launches for the attention, one for the compression; none reads a slot the row
cannot see.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..attention.triton_fwd import LOG2E
from ..common.attn_triton import dot_precision, head_constexprs, mm, pow2
from ..common.attn_utils import rows_contiguous
from ..common.backend import new_empty, triton_interpreting
from ..common.tl_util import cast
from ..dsa.triton_attn import _launch as dsa_launch
from ..dsa.triton_attn import _sparse_split_kernel
from .common import NSAGeometry

IDX_MASK = tl.constexpr((1 << 20) - 1)  # the low bits of a block's ranking key: its index reversed
MAX_BLOCKS = 1 << 20  # selection blocks a buffer may hold (the key's index field)


@triton.jit
def _visible(POS, b, NC, CMP: tl.constexpr, STRIDE: tl.constexpr):
    """(t_b, the compressed keys a query at t_b sees: ⌊(t + 1 − l)/d⌋ + 1, at most NC)."""
    t = tl.load(POS + b).to(tl.int32)
    # non-negative operands only: integer division rounds differently below zero on the GPU
    return t, tl.minimum(tl.where(t + 1 >= CMP, (tl.maximum(t + 1 - CMP, 0)) // STRIDE + 1, 0), NC)


@triton.jit
def _block_keys(p_slc, jb, t, NSB, SEL: tl.constexpr):
    """One int64 ranking key per selection block jb: its score's bits (a non-negative float's
    order is its bits' order; blocks 0, ⌊t/l'⌋ and the one before forced to +inf) above its
    index reversed, so a larger key is a higher score, ties to the lower block; −1 for the blocks
    the row may not choose (after ⌊t/l'⌋, or past the buffer's NSB)."""
    cur = t // SEL
    forced = (jb == 0) | (jb == cur) | (jb == cur - 1)
    score = tl.where(forced, float("inf"), p_slc)
    key = (score.to(tl.int32, bitcast=True).to(tl.int64) << 20) | (IDX_MASK - jb)
    return tl.where((jb <= cur) & (jb < NSB), key, -1)


@triton.jit
def _write_block(dst, key, t, SEL: tl.constexpr, o_sel, BNSB: tl.constexpr):
    """The tokens ≤ t of the block whose key is `key` into dst[0 : SEL], −1 past t; key −1 (no
    block left) writes the tokens of block BNSB, which all lie past the buffer (BNSB · SEL ≥ L > t)."""
    blk = tl.where(key >= 0, IDX_MASK - (key & IDX_MASK), BNSB).to(tl.int32)
    tok = blk * SEL + o_sel
    tl.store(dst + o_sel, tl.where(tok <= t, tok, -1).to(tl.int32), mask=o_sel < SEL)


@triton.jit
def _choose_blocks(
    pm_row, idx_row, t, n_vis, NSB, SEL: tl.constexpr, BSEL: tl.constexpr, CMP: tl.constexpr,
    STRIDE: tl.constexpr, NSEL: tl.constexpr, BNSB: tl.constexpr,
):  # fmt: skip
    """From the group-mean probabilities `pm_row[0 : n_vis]`: the block scores, blocks 0, ⌊t/l'⌋ and
    the one before forced, those after ⌊t/l'⌋ excluded, the top NSEL (ties to the lower block);
    each chosen block's tokens ≤ t into `idx_row`, −1 past them."""
    A: tl.constexpr = SEL // STRIDE
    U: tl.constexpr = CMP // STRIDE
    jb = tl.arange(0, BNSB)
    p_slc = tl.zeros([BNSB], dtype=tl.float32)
    for mi in tl.static_range(A):
        for u in tl.static_range(U):
            src = A * jb - mi - u
            hit = (src >= 0) & (src < n_vis) & (jb < NSB)
            p_slc += tl.load(pm_row + tl.where(hit, src, 0), mask=hit, other=0.0)
    key = _block_keys(p_slc, jb, t, NSB, SEL)
    o_sel = tl.arange(0, BSEL)
    for s_i in range(NSEL):
        best = tl.max(key, 0)
        _write_block(idx_row + s_i * SEL, best, t, SEL, o_sel, BNSB)
        key = tl.where(key == best, -1, key)


@triton.jit
def _window_tokens(idx_row, t, WINDOW: tl.constexpr, BW: tl.constexpr):
    """Slots t − w + 1 … t into `idx_row[0 : w]`, −1 before slot 0."""
    j = tl.arange(0, BW)
    tok = t - WINDOW + 1 + j
    tl.store(idx_row + j, tl.where(tok >= 0, tok, -1).to(tl.int32), mask=j < WINDOW)


@triton.jit
def _cmp_scores(q, kc_base, j, ok, offs_d, SKCN, D: tl.constexpr, qk_scale, DOT_PREC: tl.constexpr):
    """Scores (log2 units) of the query rows against compressed keys j `[BN]` (−inf where not ok)."""
    kc = tl.load(kc_base + j.to(tl.int64)[:, None] * SKCN + offs_d[None, :],
                 mask=ok[:, None] & (offs_d[None, :] < D), other=0.0)  # fmt: skip
    return tl.where(ok[None, :], mm(q, tl.trans(kc), DOT_PREC) * qk_scale, float("-inf"))


@triton.jit
def _index_row(
    pm_row, idx_row, t, n_vis, NSB, SEL: tl.constexpr, BSEL: tl.constexpr, CMP: tl.constexpr,
    STRIDE: tl.constexpr, NSEL: tl.constexpr, BNSB: tl.constexpr, WINDOW: tl.constexpr, BW: tl.constexpr,
):  # fmt: skip
    """The row's attended tokens: the chosen blocks' (`_choose_blocks`), then the window's."""
    _choose_blocks(pm_row, idx_row, t, n_vis, NSB, SEL, BSEL, CMP, STRIDE, NSEL, BNSB)
    if WINDOW > 0:
        _window_tokens(idx_row + NSEL * SEL, t, WINDOW, BW)


@triton.jit
def _group(
    Q, KC, VC, POS, pid, NC, SQB, SKCB, SKCH, SVCB, SVCH, HQ: tl.constexpr, GRP: tl.constexpr,
    D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, CMP: tl.constexpr, STRIDE: tl.constexpr,
):  # fmt: skip
    """Program pid's (b, hk) group: its batch row b, position t, visible compressed keys n_vis, the
    query rows `[BR, BD]` (rows past GRP zero), which rows are real, and its K/V cache bases."""
    HKV: tl.constexpr = HQ // GRP
    b, hk = pid // HKV, pid % HKV
    t, n_vis = _visible(POS, b, NC, CMP, STRIDE)
    r = tl.arange(0, BR)
    in_r = r < GRP
    offs_d = tl.arange(0, BD)
    rows = b.to(tl.int64) * SQB + (hk * GRP + r).to(tl.int64) * D
    q = tl.load(Q + rows[:, None] + offs_d[None, :], mask=in_r[:, None] & (offs_d[None, :] < D), other=0.0)
    kc_base = KC + b.to(tl.int64) * SKCB + hk.to(tl.int64) * SKCH
    vc_base = VC + b.to(tl.int64) * SVCB + hk.to(tl.int64) * SVCH
    return b, hk, t, n_vis, q, in_r, kc_base, vc_base


@triton.jit
def nsa_decode_select_kernel(
    Q, KC, VC, POS, OCMP, PM, IDX, NC, NSB, qk_scale, SQB, SKCB, SKCN, SKCH, SVCB, SVCN, SVCH,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, SEL: tl.constexpr, BSEL: tl.constexpr,
    CMP: tl.constexpr, STRIDE: tl.constexpr, NSEL: tl.constexpr, BNSB: tl.constexpr, WINDOW: tl.constexpr,
    BW: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Program (b, hk): o_cmp of the group's heads into OCMP `[B, HQ, DV]` (fp32), the group-mean
    probabilities into PM `[B·HKV, NC]` (fp32 scratch), the chosen blocks' tokens into IDX
    `[B, HKV, NSEL·SEL]` (int32, −1 pads). Q `[B, HQ, D]` (heads D apart), KC/VC strided."""
    pid = tl.program_id(0)
    b, hk, t, n_vis, q, in_r, kc_base, vc_base = _group(
        Q, KC, VC, POS, pid, NC, SQB, SKCB, SKCH, SVCB, SVCH, HQ, GRP, D, BD, BR, CMP, STRIDE
    )
    r = tl.arange(0, BR)
    offs_d, offs_dv = tl.arange(0, BD), tl.arange(0, BDV)
    # pass 1: each row's max and sum over the visible compressed keys (log2 units)
    m_i = tl.full([BR], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BR], dtype=tl.float32)
    for j0 in range(0, n_vis, BN):
        j = j0 + tl.arange(0, BN)
        ok = j < n_vis
        s = _cmp_scores(q, kc_base, j, ok, offs_d, SKCN, D, qk_scale, DOT_PREC)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
        m_i = m_new
    m_fin = tl.where(m_i > float("-inf"), m_i, 0.0)
    inv_l = tl.where(l_i > 0.0, 1.0 / tl.where(l_i > 0.0, l_i, 1.0), 0.0)
    # pass 2: the probabilities, o_cmp and the group mean of p
    acc = tl.zeros([BR, BDV], dtype=tl.float32)
    pm_row = PM + pid.to(tl.int64) * NC
    for j0 in range(0, n_vis, BN):
        j = j0 + tl.arange(0, BN)
        ok = j < n_vis
        s = _cmp_scores(q, kc_base, j, ok, offs_d, SKCN, D, qk_scale, DOT_PREC)
        p = tl.exp2(s - m_fin[:, None]) * inv_l[:, None]
        p = tl.where(in_r[:, None] & ok[None, :], p, 0.0)
        vc = tl.load(vc_base + j.to(tl.int64)[:, None] * SVCN + offs_dv[None, :],
                     mask=ok[:, None] & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
        acc += mm(p.to(vc.dtype), vc, DOT_PREC)
        tl.store(pm_row + j, tl.sum(p, 0) / GRP, mask=ok)
    o_rows = (b * HQ + hk * GRP + r).to(tl.int64) * DV
    tl.store(OCMP + o_rows[:, None] + offs_dv[None, :], acc, mask=in_r[:, None] & (offs_dv[None, :] < DV))
    tl.debug_barrier()  # the scratch row is read back across the program's threads
    _index_row(pm_row, IDX + pid.to(tl.int64) * (NSEL * SEL + WINDOW), t, n_vis, NSB, SEL, BSEL, CMP, STRIDE,
               NSEL, BNSB, WINDOW, BW)  # fmt: skip


@triton.jit
def nsa_decode_cmp_split_kernel(
    Q, KC, VC, POS, SC, M_PART, L_PART, O_PART, NC, CHUNK, qk_scale, SQB, SKCB, SKCN, SKCH, SVCB, SVCN,
    SVCH, HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, CMP: tl.constexpr, STRIDE: tl.constexpr,
    NSPLIT: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Program (b, hk, split): the compressed branch over keys [split·CHUNK, (split+1)·CHUNK) of
    the visible ones, one pass: the scores (log2 units) into SC `[B·HKV, BR, NC]`, the partial max,
    sum and unnormalised o into M_PART, L_PART `[B·HKV, NSPLIT, BR]`, O_PART `[…, BDV]` (fp32)."""
    pid, split = tl.program_id(0), tl.program_id(1)
    b, hk, t, n_vis, q, in_r, kc_base, vc_base = _group(
        Q, KC, VC, POS, pid, NC, SQB, SKCB, SKCH, SVCB, SVCH, HQ, GRP, D, BD, BR, CMP, STRIDE
    )
    r = tl.arange(0, BR)
    offs_d, offs_dv = tl.arange(0, BD), tl.arange(0, BDV)
    sc_rows = SC + (pid.to(tl.int64) * BR + r)[:, None] * NC
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, n_vis)
    m_i = tl.full([BR], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BR], dtype=tl.float32)
    acc = tl.zeros([BR, BDV], dtype=tl.float32)
    for j0 in range(lo, hi, BN):
        j = j0 + tl.arange(0, BN)
        ok = j < hi
        s = _cmp_scores(q, kc_base, j, ok, offs_d, SKCN, D, qk_scale, DOT_PREC)
        tl.store(sc_rows + j[None, :], s, mask=ok[None, :])
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vc = tl.load(vc_base + j.to(tl.int64)[:, None] * SVCN + offs_dv[None, :],
                     mask=ok[:, None] & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
        acc = acc * alpha[:, None] + mm(p.to(vc.dtype), vc, DOT_PREC)
        m_i = m_new
    part = (pid * NSPLIT + split).to(tl.int64) * BR + r
    tl.store(M_PART + part, m_i)
    tl.store(L_PART + part, l_i)
    tl.store(O_PART + part[:, None] * BDV + offs_dv[None, :], acc)


@triton.jit
def _merged_stats(M_PART, L_PART, pid, r, NSPLIT: tl.constexpr, BS: tl.constexpr, BR: tl.constexpr):
    """Row r's max and sum over all splits of the compressed branch, from the split partials
    `[B·HKV, NSPLIT, BR]` loaded as one `[BS, BR]` tile (one round trip, not one a split): the
    max (0 where every score is −inf), each split's weight 2^(m_split − max) `[BS, BR]`, 1/sum
    (0 where the sum is 0)."""
    sp = tl.arange(0, BS)
    live = sp < NSPLIT
    part = (pid.to(tl.int64) * NSPLIT + sp)[:, None] * BR + r[None, :]
    mp = tl.load(M_PART + part, mask=live[:, None], other=float("-inf"))
    lp = tl.load(L_PART + part, mask=live[:, None], other=0.0)
    m = tl.max(mp, 0)
    m_fin = tl.where(m > float("-inf"), m, 0.0)
    w = tl.where(mp > float("-inf"), tl.exp2(mp - m_fin[None, :]), 0.0)
    l_i = tl.sum(w * lp, 0)
    return m_fin, w, tl.where(l_i > 0.0, 1.0 / tl.where(l_i > 0.0, l_i, 1.0), 0.0)


@triton.jit
def nsa_decode_slice_select_kernel(
    POS, SC, M_PART, L_PART, CAND, NC, NSB, HKV: tl.constexpr, GRP: tl.constexpr, BR: tl.constexpr,
    SEL: tl.constexpr, CMP: tl.constexpr, STRIDE: tl.constexpr, NSEL: tl.constexpr, BNS: tl.constexpr,
    BSB: tl.constexpr, NSPLIT: tl.constexpr, BS: tl.constexpr,
):  # fmt: skip
    """Program (b·HKV + hk, slice): selection blocks [slice·BSB, (slice+1)·BSB). Their scores from
    the split form's kept scores SC `[B·HKV, BR, NC]` (log2 units) and the merged statistics (the
    group-mean probabilities of the compressed keys each block covers, as `_choose_blocks`), their
    ranking keys (`_block_keys`), and the slice's top NSEL keys by rank (a block's rank: how many
    keys of the slice exceed its own; the keys are distinct) into CAND `[B·HKV, slices, NSEL]` in
    rank order, −1 where the slice has fewer choosable blocks. Every slice works at once: the work
    a row's context adds spreads over the card instead of one program's serial loop."""
    A: tl.constexpr = SEL // STRIDE
    U: tl.constexpr = CMP // STRIDE
    pid, sl = tl.program_id(0), tl.program_id(1)
    t, n_vis = _visible(POS, pid // HKV, NC, CMP, STRIDE)
    r = tl.arange(0, BR)
    in_r = r < GRP
    m_fin, _, inv_l = _merged_stats(M_PART, L_PART, pid, r, NSPLIT, BS, BR)
    sc_rows = SC + (pid.to(tl.int64) * BR + r)[:, None] * NC
    jb = sl * BSB + tl.arange(0, BSB)
    p_slc = tl.zeros([BSB], dtype=tl.float32)
    for mi in tl.static_range(A):
        for u in tl.static_range(U):
            src = A * jb - mi - u
            hit = (src >= 0) & (src < n_vis) & (jb < NSB)
            ok = in_r[:, None] & hit[None, :]
            s = tl.load(sc_rows + tl.where(hit, src, 0)[None, :], mask=ok, other=float("-inf"))
            p = tl.where(ok, tl.exp2(s - m_fin[:, None]) * inv_l[:, None], 0.0)
            p_slc += tl.sum(p, 0) / GRP
    key = _block_keys(p_slc, jb, t, NSB, SEL)
    rank = tl.sum((key[None, :] > key[:, None]).to(tl.int32), 1)
    n_ok = tl.sum((key >= 0).to(tl.int32), 0)
    cand = CAND + (pid.to(tl.int64) * tl.num_programs(1) + sl) * NSEL
    tl.store(cand + rank, key, mask=(key >= 0) & (rank < NSEL))
    slot = tl.arange(0, BNS)
    tl.store(cand + slot, tl.full([BNS], -1, tl.int64), mask=(slot >= n_ok) & (slot < NSEL))


@triton.jit
def nsa_decode_choose_kernel(
    POS, CAND, IDX, NCAND, HKV: tl.constexpr, SEL: tl.constexpr, BSEL: tl.constexpr, NSEL: tl.constexpr,
    BC: tl.constexpr, BNSB: tl.constexpr, WINDOW: tl.constexpr, BW: tl.constexpr,
):  # fmt: skip
    """Program b·HKV + hk (one warp: its arg-max rounds are shuffles, no shared memory): the row's
    top NSEL blocks among the NCAND slice candidates (the slices' top NSEL hold the row's), by NSEL
    rounds of arg-max in the order `_choose_blocks` writes them, each block's tokens ≤ t into IDX
    `[B, HKV, NSEL·SEL + WINDOW]` (−1 pads), then the window's."""
    pid = tl.program_id(0)
    t = tl.load(POS + pid // HKV).to(tl.int32)
    c = tl.arange(0, BC)
    key = tl.load(CAND + pid.to(tl.int64) * NCAND + c, mask=c < NCAND, other=-1)
    idx_row = IDX + pid.to(tl.int64) * (NSEL * SEL + WINDOW)
    o_sel = tl.arange(0, BSEL)
    for s_i in range(NSEL):
        best = tl.max(key, 0)
        _write_block(idx_row + s_i * SEL, best, t, SEL, o_sel, BNSB)
        key = tl.where(key == best, -1, key)
    if WINDOW > 0:
        _window_tokens(idx_row + NSEL * SEL, t, WINDOW, BW)


@triton.jit
def nsa_decode_combine_kernel(
    O_PART, LSE_PART, OCMP, CM_PART, CL_PART, CO_PART, G, OUT, SG, NS_SLC,
    HQ: tl.constexpr, GRP: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr, BR: tl.constexpr,
    NSPLIT: tl.constexpr, BS: tl.constexpr, LOGITS: tl.constexpr, NSC: tl.constexpr, BSC: tl.constexpr,
    CBR: tl.constexpr,
):  # fmt: skip
    """Program (b·HKV + hk, row r of the group): the partials of
    `dsa.triton_attn._sparse_split_kernel` over one index row (splits [0, NS_SLC) the selected
    blocks' tokens, the rest the window's) merged per branch by their lse, then OUT = g_slc · o_slc +
    g_cmp · o_cmp + g_swa · o_swa in fp32 for head hk·GRP + r, cast once. The splits are one vector
    of BS ≥ NSPLIT (their loads go out together). G the gates `[B, HQ, 3]` (cmp, slc, swa), rows SG
    apart (with LOGITS their logits: the weights are their sigmoids, taken here in fp32). o_cmp:
    OCMP `[B, HQ, DV]` (NSC = 0), or merged here from the compressed branch's NSC split partials
    (`nsa_decode_cmp_split_kernel`'s, rows CBR apart; BSC ≥ NSC, one vector), so no program merges
    them all for the whole group."""
    HKV: tl.constexpr = HQ // GRP
    pid, r = tl.program_id(0), tl.program_id(1)
    b, hk = pid // HKV, pid % HKV
    sp = tl.arange(0, BS)
    live = sp < NSPLIT
    slc = sp < NS_SLC
    part = (pid.to(tl.int64) * NSPLIT + sp) * BR + r
    lse = tl.load(LSE_PART + part, mask=live, other=float("-inf"))
    m_s = tl.max(tl.where(slc, lse, float("-inf")), 0)
    m_w = tl.max(tl.where(slc, float("-inf"), lse), 0)
    m_s = tl.where(m_s > float("-inf"), m_s, 0.0)
    m_w = tl.where(m_w > float("-inf"), m_w, 0.0)
    w = tl.where(lse > float("-inf"), tl.exp2(lse - tl.where(slc, m_s, m_w)), 0.0)
    w_s = tl.where(slc, w, 0.0)
    w_w = tl.where(slc, 0.0, w)
    den_s, den_w = tl.sum(w_s, 0), tl.sum(w_w, 0)
    offs = tl.arange(0, BDV)
    o_p = tl.load(O_PART + part[:, None] * BDV + offs[None, :], mask=live[:, None], other=0.0)
    o_s = tl.sum(w_s[:, None] * o_p, 0)
    o_w = tl.sum(w_w[:, None] * o_p, 0)
    head = b.to(tl.int64) * HQ + hk * GRP + r
    g_base = G + b.to(tl.int64) * SG + (hk * GRP + r) * 3
    g_cmp = tl.load(g_base).to(tl.float32)
    g_slc = tl.load(g_base + 1).to(tl.float32)
    g_swa = tl.load(g_base + 2).to(tl.float32)
    if LOGITS:
        g_cmp, g_slc, g_swa = tl.sigmoid(g_cmp), tl.sigmoid(g_slc), tl.sigmoid(g_swa)
    m = offs < DV
    o = o_s * (g_slc / tl.where(den_s > 0.0, den_s, 1.0))
    o += (g_swa / tl.where(den_w > 0.0, den_w, 1.0)) * o_w
    if NSC == 0:
        o_cmp = tl.load(OCMP + head * DV + offs, mask=m, other=0.0)
    else:
        spc = tl.arange(0, BSC)
        live_c = spc < NSC
        part_c = (pid.to(tl.int64) * NSC + spc) * CBR + r
        m_c = tl.load(CM_PART + part_c, mask=live_c, other=float("-inf"))
        top = tl.max(m_c, 0)
        w_c = tl.where(m_c > float("-inf"), tl.exp2(m_c - tl.where(top > float("-inf"), top, 0.0)), 0.0)
        l_c = tl.sum(w_c * tl.load(CL_PART + part_c, mask=live_c, other=0.0), 0)
        o_c = tl.load(CO_PART + part_c[:, None] * BDV + offs[None, :], mask=live_c[:, None], other=0.0)
        o_cmp = tl.sum(w_c[:, None] * o_c, 0) * tl.where(l_c > 0.0, 1.0 / tl.where(l_c > 0.0, l_c, 1.0), 0.0)
    o += g_cmp * o_cmp
    tl.store(OUT + head * DV + offs, cast(o, OUT.dtype.element_ty), mask=m)


@triton.jit
def _compress_block(
    X, BUF, PE, W, BIAS, b, h, m, NC, SXB, SXT, SXH, SBB, SBH, SBN, D: tl.constexpr, BD: tl.constexpr,
    CMP: tl.constexpr, BL: tl.constexpr, STRIDE: tl.constexpr, MLP: tl.constexpr, BO: tl.constexpr,
):  # fmt: skip
    """Where the row's m-th token completes compression block i (m ≥ l and d divides m − l),
    BUF[b, h, i] = φ(x[b, i·d : i·d + l, h]): the mean of the l rows, or with MLP
    W · flatten(x + PE) + BIAS (x + PE rounded to x's dtype, as the unfused add is)."""
    done = tl.maximum(m - CMP, 0)
    i = done // STRIDE
    if (m >= CMP) & (done % STRIDE == 0) & (i < NC):
        offs = tl.arange(0, BD)
        x_base = X + b.to(tl.int64) * SXB + h.to(tl.int64) * SXH + (i * STRIDE).to(tl.int64) * SXT
        out_base = BUF + b.to(tl.int64) * SBB + h.to(tl.int64) * SBH + i.to(tl.int64) * SBN
        if MLP:
            for o0 in tl.static_range(0, BD, BO):
                o = o0 + tl.arange(0, BO)
                acc = tl.load(BIAS + o, mask=o < D, other=0.0).to(tl.float32)
                for r in range(CMP):
                    xr = tl.load(x_base + r * SXT + offs, mask=offs < D, other=0.0)
                    pe = tl.load(PE + r * D + offs, mask=offs < D, other=0.0).to(tl.float32)
                    # x + pe in x's dtype, as the unfused add: pe rounded first, then the sum
                    pe = cast(pe, xr.dtype).to(tl.float32)
                    xr = cast(xr.to(tl.float32) + pe, xr.dtype).to(tl.float32)
                    w = tl.load(W + o[:, None] * (CMP * D) + r * D + offs[None, :],
                                mask=(o[:, None] < D) & (offs[None, :] < D), other=0.0)  # fmt: skip
                    acc += tl.sum(w.to(tl.float32) * xr[None, :], 1)
                tl.store(out_base + o, cast(acc, BUF.dtype.element_ty), mask=o < D)
        else:
            rows = tl.arange(0, BL)
            ok = (rows < CMP)[:, None] & (offs[None, :] < D)
            x = tl.load(x_base + rows.to(tl.int64)[:, None] * SXT + offs[None, :], mask=ok, other=0.0)
            y = tl.sum(x.to(tl.float32), 0) / CMP
            tl.store(out_base + offs, cast(y, BUF.dtype.element_ty), mask=offs < D)


@triton.jit
def nsa_decode_compress_kernel(
    X0, BUF0, PE0, W0, BIAS0, SXB0, SXT0, SXH0, SBB0, SBH0, SBN0,
    X1, BUF1, PE1, W1, BIAS1, SXB1, SXT1, SXH1, SBB1, SBH1, SBN1, POS, NC,
    HKV: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, CMP: tl.constexpr, BL: tl.constexpr,
    STRIDE: tl.constexpr, MLP: tl.constexpr, BO: tl.constexpr,
):  # fmt: skip
    """Program (b · HKV + h, which): `_compress_block` of the keys (which 0: X0 into BUF0 with φ's
    PE0, W0, BIAS0) or of the values (which 1: X1 …; a grid of one `which` leaves them out). Rows
    whose token completes no block write nothing: their newest block is in the buffer already (or
    not complete, and no query sees it before it is)."""
    pid, which = tl.program_id(0), tl.program_id(1)
    b, h = pid // HKV, pid % HKV
    m = tl.load(POS + b).to(tl.int32) + 1
    if which == 0:
        _compress_block(X0, BUF0, PE0, W0, BIAS0, b, h, m, NC, SXB0, SXT0, SXH0, SBB0, SBH0, SBN0,
                        D, BD, CMP, BL, STRIDE, MLP, BO)  # fmt: skip
    else:
        _compress_block(X1, BUF1, PE1, W1, BIAS1, b, h, m, NC, SXB1, SXT1, SXH1, SBB1, SBH1, SBN1,
                        D, BD, CMP, BL, STRIDE, MLP, BO)  # fmt: skip


def select_tile(d: int) -> int:
    """Compressed keys a tile of the select kernel takes (16 under the interpreter)."""
    if triton_interpreting():
        return 16
    return 64 if d <= 128 else 32


def select_slice_blocks() -> int:
    """Selection blocks one program of the split form scores and ranks: 64 (a 64 x 64 rank
    comparison a slice; 4 under the interpreter, so the CPU tests run several slices)."""
    return 4 if triton_interpreting() else 64


def compress_step(bufs, xs, t, cmp_block: int, stride: int, phis: tuple) -> tuple[torch.Tensor, ...]:
    """`engine.sparse.compress_rows` on the Triton path, for the keys and the values at once (or
    one of them): the newest compression block of each row whose new token completes one, φ the
    mean or (a phi of (pos_emb, weight, bias)) the learned map, into each `buf [B, HKV, NC, d]` in
    place; one launch. xs `[B, L, HKV, d]` (last dim contiguous). Returns the buffers as
    `[B, NC, HKV, d]`."""
    B, L, HKV, d = xs[0].shape
    NC = bufs[0].shape[2]
    mlp = len(phis[0]) == 3 and phis[0][1] is not None
    args = []
    for buf, x, phi in zip((*bufs, bufs[0]), (*xs, xs[0]), (*phis, phis[0])):
        pe, w, bias = phi if mlp else (buf, buf, buf)
        if bias is None:
            bias = torch.zeros(d, device=x.device, dtype=torch.float32)
        args += [x, buf, pe, w, bias, *x.stride()[:3], *buf.stride()[:3]]
    if NC and B:
        nsa_decode_compress_kernel[(B * HKV, len(bufs))](
            *args[:22], t, NC, HKV=HKV, D=d, BD=triton.next_power_of_2(d), CMP=cmp_block,
            BL=triton.next_power_of_2(cmp_block), STRIDE=stride, MLP=mlp,
            BO=min(32, triton.next_power_of_2(d)), num_warps=1 if triton_interpreting() else 4, num_stages=1,
        )  # fmt: skip
    return tuple(buf.transpose(1, 2) for buf in bufs)


def attention_splits(n_slc: int, window: int, programs: int, bk: int, device) -> tuple[int, int]:
    """(chunk, splits of the selected tokens) for one index row of n_slc selected tokens and the
    window's: a chunk that divides n_slc (no split mixes the two softmaxes) of at least `bk`
    slots where one exists, as many splits as `dsa.triton_attn.split_count` would give the row."""
    from ..dsa.triton_attn import split_count

    want = max(1, split_count(programs, n_slc + window, bk, device))
    k = max((d for d in range(1, min(want, n_slc) + 1) if n_slc % d == 0 and n_slc // d >= bk), default=1)
    return n_slc // k, k


# the compressed branch stays one kernel for at most this many tiles of compressed keys
CMP_SPLIT_TILES = 4


def cmp_splits(programs: int, nc: int, bn: int, device) -> int:
    """Programs the compressed branch of one (row, kv head) is split over: 1 (the one-kernel form)
    where the B·HKV `programs` fill the GPU or the buffer holds at most 4 tiles of compressed keys;
    else enough for about 2 programs an SM, each ≥ 2 tiles. Under the interpreter 2 for buffers of
    more than 2 tiles, so the CPU tests run the split form."""
    if triton_interpreting():
        return 2 if nc > 2 * bn else 1
    n_sm = torch.cuda.get_device_properties(device).multi_processor_count
    if programs >= n_sm or nc <= CMP_SPLIT_TILES * bn:
        return 1
    return max(1, min(triton.cdiv(2 * n_sm, programs), triton.cdiv(nc, 2 * bn)))


def nsa_decode_triton(q, k, v, g, k_cmp, v_cmp, t, geometry: dict, scale: float | None = None,
                      return_indices: bool = False, splits: int | None = None,
                      gate_logits: bool = False, slice_blocks: int | None = None):  # fmt: skip
    """NSA of one query per row at position t_b, as `engine.sparse.nsa_rows` (see the module
    docstring). q `[B, 1, HQ, K]`; k, v `[B, L, HKV, *]` buffers; g `[B, 1, HQ, 3]` (cmp, slc, swa);
    k_cmp, v_cmp `[B, NC, HKV, *]` (any strides, last dim contiguous); t `[B]`; `splits` of the
    compressed branch (`cmp_splits` when None); `slice_blocks`: selection blocks a program of the
    split form scores and ranks (`select_slice_blocks` when None); `gate_logits`: g holds the
    gates' logits (their sigmoids taken in the combine kernel, no launch of their own). Returns
    `[B, 1, HQ, V]` in v's dtype, and with `return_indices` the attended tokens
    `[B, 1, HKV, n·l' + w]` (the chosen blocks', the window's)."""
    B, _, HQ, D = q.shape
    L, HKV, DV = k.shape[1], k.shape[2], v.shape[3]
    NC = k_cmp.shape[1]
    geo = NSAGeometry.make(geometry["block"], geometry["cmp_block"], geometry["stride"])
    nsel, window = int(geometry["select"]), int(geometry["window"])
    scale = D**-0.5 if scale is None else float(scale)
    q = q.contiguous()
    hc = head_constexprs(q, k, v)
    G, BR, BN = HQ // HKV, pow2(HQ // HKV), select_tile(D)
    n_slc = nsel * geo.sel
    idx = new_empty(q, B, 1, HKV, n_slc + window, dtype=torch.int32)
    nsb = geo.n_sel(L)
    if nsb > MAX_BLOCKS:
        raise ValueError(f"NSA decode takes at most {MAX_BLOCKS} selection blocks, got {nsb} ({L} slots)")
    warps = 1 if triton_interpreting() else 4
    sel = dict(SEL=geo.sel, BSEL=triton.next_power_of_2(geo.sel), CMP=geo.cmp, STRIDE=geo.stride, NSEL=nsel,
               BNSB=triton.next_power_of_2(max(nsb, 1)), WINDOW=window,
               BW=triton.next_power_of_2(max(window, 1)))  # fmt: skip
    strides = (q.stride(0), *k_cmp.stride()[:3], *v_cmp.stride()[:3])
    ns = cmp_splits(B * HKV, NC, BN, q.device) if splits is None else max(1, int(splits))
    prec = dot_precision(q.dtype)
    if ns == 1:
        o_cmp = new_empty(q, B, HQ, DV, dtype=torch.float32)
        pm = new_empty(q, B * HKV, max(NC, 1), dtype=torch.float32)
        nsa_decode_select_kernel[(B * HKV,)](
            q, k_cmp, v_cmp, t, o_cmp, pm, idx, NC, nsb, scale * LOG2E, *strides, **hc, BR=BR, BN=BN, **sel,
            DOT_PREC=prec, num_warps=warps, num_stages=1,
        )  # fmt: skip
        cmp_parts, nsc = (o_cmp, o_cmp, o_cmp), 0  # the partials unread where NSC = 0
    else:
        chunk = triton.cdiv(triton.cdiv(max(NC, 1), ns), BN) * BN
        ns = triton.cdiv(max(NC, 1), chunk)
        sc = new_empty(q, B * HKV * BR, max(NC, 1), dtype=torch.float32)
        m_part, l_part = (new_empty(q, B * HKV * ns * BR, dtype=torch.float32) for _ in range(2))
        o_part = new_empty(q, B * HKV * ns * BR, hc["BDV"], dtype=torch.float32)
        nsa_decode_cmp_split_kernel[(B * HKV, ns)](
            q, k_cmp, v_cmp, t, sc, m_part, l_part, o_part, NC, chunk, scale * LOG2E, *strides, **hc, BR=BR,
            BN=BN, CMP=geo.cmp, STRIDE=geo.stride, NSPLIT=ns, DOT_PREC=prec, num_warps=warps, num_stages=1,
        )  # fmt: skip
        bsb = pow2(slice_blocks) if slice_blocks else select_slice_blocks()
        nsl = triton.cdiv(max(nsb, 1), bsb)
        cand = new_empty(q, B * HKV, nsl * nsel, dtype=torch.int64)
        nsa_decode_slice_select_kernel[(B * HKV, nsl)](
            t, sc, m_part, l_part, cand, NC, nsb, HKV=HKV, GRP=G, BR=BR, SEL=geo.sel, CMP=geo.cmp,
            STRIDE=geo.stride, NSEL=nsel, BNS=pow2(nsel), BSB=bsb, NSPLIT=ns, BS=pow2(ns), num_warps=warps,
            num_stages=1,
        )  # fmt: skip
        nsa_decode_choose_kernel[(B * HKV,)](
            t, cand, idx, nsl * nsel, HKV=HKV, SEL=geo.sel, BSEL=sel["BSEL"], NSEL=nsel, BC=pow2(nsl * nsel),
            BNSB=sel["BNSB"], WINDOW=window, BW=sel["BW"], num_warps=1, num_stages=1,
        )  # fmt: skip
        cmp_parts, nsc = (m_part, l_part, o_part), ns  # merged per head by the combine kernel
        o_cmp = m_part  # unread where NSC > 0
    # the selected and the window branches: one split launch over the row's tokens, chunks that
    # never straddle the two, merged per branch and mixed with the gates by the combine kernel
    kc, vc = rows_contiguous(k), rows_contiguous(v)
    cex = dsa_launch(q, kc, vc, idx)
    chunk, ns_slc = attention_splits(n_slc, window, B * HKV, cex["BK"], q.device)
    ns = ns_slc + triton.cdiv(window, chunk)
    o_part = new_empty(q, B * HKV * ns * cex["BR"], cex["BDV"], dtype=torch.float32)
    lse_part = new_empty(q, B * HKV * ns * cex["BR"], dtype=torch.float32)
    kv_strides = (kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2))
    _sparse_split_kernel[(1, B * HKV, ns)](
        q, kc, vc, idx, o_part, lse_part, 1, L, n_slc + window, chunk, scale * LOG2E, *kv_strides, NSPLIT=ns,
        **cex,
    )  # fmt: skip
    out = new_empty(v, B, 1, HQ, DV)
    gc = g.reshape(B, HQ, 3)
    if gc.stride(-1) != 1 or gc.stride(1) != 3:
        gc = gc.contiguous()
    if cex["BDV"] != hc["BDV"] or cex["BR"] != BR:
        raise AssertionError("the compressed partials' rows must be the combine kernel's")
    nsa_decode_combine_kernel[(B * HKV, G)](
        o_part, lse_part, o_cmp, *cmp_parts, gc, out, gc.stride(0), ns_slc,
        HQ=HQ, GRP=G, DV=DV, BDV=cex["BDV"], BR=cex["BR"], NSPLIT=ns, BS=triton.next_power_of_2(ns),
        LOGITS=gate_logits, NSC=nsc, BSC=pow2(max(nsc, 1)), CBR=BR, num_warps=warps, num_stages=1,
    )  # fmt: skip
    return (out, idx) if return_indices else out
