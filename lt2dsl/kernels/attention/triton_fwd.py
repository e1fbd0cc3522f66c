"""Triton forward of `attention`: tiled online softmax (FlashAttention-2 layout) with a gate epilogue.

One program owns BM query rows of one query head and walks the key blocks its band can see: block
skipping for the causal diagonal and the sliding window, the mask only on the edge blocks, exp2 with
log2(e) folded into the score scale, fp32 accumulators, GQA by reading kv head h // G.
The key positions are `c · KSTRIDE + KOFF` for key index c: 1 / 0 for ordinary attention; NSA's
compressed branch reuses the kernel with key c standing for the block that ends at c·d + l − 1.
Hopper notes: no `tl.trans` of a `tl.dot` result feeds another dot here (the Triton 3.4–3.7 wgmma
miscompile of the peer's tracker); k is read through a transposed pointer instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.attn_triton import (
    dot_precision,
    head_constexprs,
    load_rows,
    mm,
    rows_mask,
    rows_ptr,
    softmax_init,
)
from ..common.backend import new_empty, triton_interpreting
from ..common.tl_util import cast

LOG2E = 1.4426950408889634
# running-max start: finite, so a fully masked first block gives p = 0, not NaN. A constexpr,
# because Triton (3.6) refuses plain module globals inside @jit functions.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _seq_bounds(pid_m, pid_bh, CU_Q, CU_K, BLK_MAP, Tq, Tk, qoff, HQ: tl.constexpr, VARLEN: tl.constexpr):
    """(batch, head, block index, q start, k start, Tq_n, Tk_n, query position offset) of a program."""
    if VARLEN:
        i_n = tl.load(BLK_MAP + 2 * pid_m).to(tl.int32)
        i_m = tl.load(BLK_MAP + 2 * pid_m + 1).to(tl.int32)
        bos_q = tl.load(CU_Q + i_n).to(tl.int32)
        bos_k = tl.load(CU_K + i_n).to(tl.int32)
        tq = tl.load(CU_Q + i_n + 1).to(tl.int32) - bos_q
        tk = tl.load(CU_K + i_n + 1).to(tl.int32) - bos_k
        return 0, pid_bh, i_m, bos_q, bos_k, tq, tk, tk - tq
    b = pid_bh // HQ
    return b, pid_bh % HQ, pid_m, b * Tq, b * Tk, Tq, Tk, qoff


@triton.jit
def _program_ids(ORDER: tl.constexpr):
    """(block index, batch·head) of this program on a `(blocks, B·H)` grid.

    ORDER 1 numbers a head's blocks backwards, so a causal launch starts each head with its longest
    query blocks and ends on its shortest, which fill the last wave's tail. The blocks of one head
    stay adjacent in launch order, so the programs running at once share a few heads' K and V in
    L2: a heads-fastest order (every head's longest block first) streamed all heads' K and V at
    once and was 6–18% slower on the GPU (BENCHMARKS.md, attention).
    """
    pid_m = tl.program_id(0)
    if ORDER == 1:
        pid_m = tl.num_programs(0) - 1 - pid_m
    return pid_m, tl.program_id(1)


def launch_order(causal: bool, window, varlen: bool) -> int:
    """ORDER of `_program_ids` for query-block launches: reversed for a causal fixed-length batch
    without a window (a window gives every block about the same number of keys)."""
    return 1 if causal and window is None and not varlen else 0


@triton.jit
def _band(
    p0, p1, Tk_n, W, KOFF, BN: tl.constexpr, CAUSAL: tl.constexpr, HAS_W: tl.constexpr, KSTRIDE: tl.constexpr
):
    """Key-block ranges for query positions p0..p1: (lo, full_lo, full_hi, hi).

    Blocks in [full_lo, full_hi) are visible to every row (no mask); [lo, full_lo) and
    [max(full_lo, full_hi), hi) are edge blocks that need the mask.
    """
    hi = Tk_n
    lo = 0
    full_lo = 0
    full_hi = (Tk_n // BN) * BN
    if CAUSAL:
        hi = tl.minimum(Tk_n, tl.where(p1 >= KOFF, (p1 - KOFF) // KSTRIDE + 1, 0))
        full_hi = tl.minimum(full_hi, ((p0 + 1) // BN) * BN)
        if KSTRIDE != 1:
            full_hi = 0
    if HAS_W:
        lo = (tl.maximum(p0 - W + 1, 0) // BN) * BN
        full_lo = tl.cdiv(tl.maximum(p1 - W + 1, 0), BN) * BN
    full_lo = tl.maximum(full_lo, lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def query_block(
    CU_Q, CU_K, BLK_MAP, Tq, Tk, qoff, HQ: tl.constexpr, GRP: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, BM: tl.constexpr, VARLEN: tl.constexpr, ORDER: tl.constexpr,
):  # fmt: skip
    """(head, kv head, block index, q start, k start, Tq_n, Tk_n, query position offset, rows `[BM]`,
    rows in range, query positions with -1 for rows past the end, head-dim and value-dim offsets,
    int64 row indices `[BM]` of the rows in Q's `[B·Tq, HQ]` rows) of a query-block program."""
    pid_m, pid_bh = _program_ids(ORDER)
    b, h, i_m, bos_q, bos_k, Tq_n, Tk_n, qo = _seq_bounds(
        pid_m, pid_bh, CU_Q, CU_K, BLK_MAP, Tq, Tk, qoff, HQ, VARLEN
    )
    rows = i_m * BM + tl.arange(0, BM)
    in_q = rows < Tq_n
    qpos = tl.where(in_q, rows + qo, -1)
    hk = h // GRP
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    row_off = ((bos_q + rows) * HQ + h).to(tl.int64)
    return h, hk, i_m, bos_q, bos_k, Tq_n, Tk_n, qo, rows, in_q, qpos, offs_d, offs_dv, row_off


@triton.jit
def query_band(
    i_m, Tq_n, qo, Tk_n, W, KOFF,
    BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, HAS_W: tl.constexpr, KSTRIDE: tl.constexpr,
):  # fmt: skip
    """`_band` of query block `i_m` (rows i_m·BM … min(i_m·BM + BM, Tq_n) − 1, shifted by qo)."""
    p0 = i_m * BM + qo
    p1 = tl.minimum(i_m * BM + BM, Tq_n) - 1 + qo
    return _band(p0, p1, Tk_n, W, KOFF, BN, CAUSAL, HAS_W, KSTRIDE)


@triton.jit
def load_keys_t(ptr, offs_n, in_k, stride_t, offs_d, D: tl.constexpr):
    """The `[BD, BN]` transposed tile of keys `offs_n` (rows `stride_t` apart), zero past Tk or D."""
    return tl.load(
        ptr + offs_n[None, :] * stride_t + offs_d[:, None],
        mask=in_k[None, :] & (offs_d[:, None] < D),
        other=0.0,
    )


@triton.jit
def visible(offs_n, in_k, qpos, W, KOFF, CAUSAL: tl.constexpr, HAS_W: tl.constexpr, KSTRIDE: tl.constexpr):
    """`[BM, BN]`: key `offs_n` (position offs_n·KSTRIDE + KOFF) is in range and seen by the query at
    `qpos` (−1 for a row past the end) under the causal mask and the window W."""
    kpos = offs_n * KSTRIDE + KOFF
    ok = in_k[None, :] & (qpos[:, None] >= 0)
    if CAUSAL:
        ok = ok & (kpos[None, :] <= qpos[:, None])
    if HAS_W:
        ok = ok & (kpos[None, :] > qpos[:, None] - W)
    return ok


@triton.jit
def band_part(PART: tl.constexpr, lo, full_lo, full_hi, hi):
    """[start, end) of part PART of a band from `_band` or `_row_band`: 0 the masked edge blocks
    before the unmasked ones, 1 the unmasked blocks, 2 the masked edge blocks after them. A kernel
    walks the parts in order, `MASK` on for 0 and 2."""
    if PART == 0:
        return lo, tl.minimum(full_lo, hi)
    elif PART == 1:
        return full_lo, full_hi
    else:
        return tl.maximum(full_lo, full_hi), hi


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, GATE, O, LSE, CU_Q, CU_K, BLK_MAP,
    Tq, Tk, qoff, W, KOFF, qk_scale, NROWS,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, HAS_W: tl.constexpr,
    KSTRIDE: tl.constexpr, GATE_MODE: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
    ORDER: tl.constexpr,
):  # fmt: skip
    """o[b, rows, h] = softmax(q kᵀ · scale + mask) v, times σ(gate); lse in log2 units.

    Q `[B, Tq, HQ, D]`, K `[B, Tk, HKV, D]`, V `[B, Tk, HKV, DV]`, GATE `[B, Tq, HQ, DV]` or `[B, Tq, HQ]`,
    O like Q with DV, LSE `[HQ, NROWS = B·Tq]` fp32 (+inf for a row that sees no key).
    """
    h, hk, i_m, bos_q, bos_k, Tq_n, Tk_n, qo, rows, in_q, qpos, offs_d, offs_dv, row_off = query_block(
        CU_Q, CU_K, BLK_MAP, Tq, Tk, qoff, HQ, GRP, BD, BDV, BM, VARLEN, ORDER
    )
    HKV = HQ // GRP
    q_ptr = Q + row_off[:, None] * D + offs_d[None, :]
    q = tl.load(q_ptr, mask=in_q[:, None] & (offs_d[None, :] < D), other=0.0)
    k_ptr = K + (bos_k.to(tl.int64) * HKV + hk) * D
    v_ptr = V + (bos_k.to(tl.int64) * HKV + hk) * DV

    lo, full_lo, full_hi, hi = query_band(i_m, Tq_n, qo, Tk_n, W, KOFF, BM, BN, CAUSAL, HAS_W, KSTRIDE)
    acc, m_i, l_i = softmax_init(BM, BDV, NEG_BIG)
    for PART in tl.static_range(3):
        if PART == 2:
            row_off = ((bos_q + rows) * HQ + h).to(tl.int64)
            # the gate is loaded before the last (diagonal) blocks, so its latency hides behind their
            # dots instead of stalling the epilogue (3% of the gated forward, BENCHMARKS.md "Tried and
            # dropped")
            if GATE_MODE == 1:
                g = load_rows(GATE, row_off, DV, in_q, offs_dv, DV)
            if GATE_MODE == 2:
                g = tl.load(GATE + row_off, mask=in_q, other=0.0)
        start, end = band_part(PART, lo, full_lo, full_hi, hi)
        # online-softmax update over the part's key blocks; scores in log2 units
        for n in range(start, end, BN):
            offs_n = n + tl.arange(0, BN)
            in_k = offs_n < Tk_n
            kt = load_keys_t(k_ptr, offs_n, in_k, HKV * D, offs_d, D)
            qk = mm(q, kt, DOT_PREC)
            if PART != 1:
                ok = visible(offs_n, in_k, qpos, W, KOFF, CAUSAL, HAS_W, KSTRIDE)
                s = tl.where(ok, qk * qk_scale, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p = tl.exp2(s - m_new[:, None])
            else:
                # scale > 0, so max(qk)·scale = max(qk·scale); the exponent is then one FMA per score
                # (a scaled copy of the tile with two uses would not contract into one)
                m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
                p = tl.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = load_rows(v_ptr, offs_n, HKV * DV, in_k, offs_dv, DV)
            acc = acc * alpha[:, None] + mm(cast(p, v.dtype), v, DOT_PREC)
            m_i = m_new
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    if GATE_MODE == 1:
        o = o * tl.sigmoid(g.to(tl.float32))
    if GATE_MODE == 2:
        o = o * tl.sigmoid(g.to(tl.float32))[:, None]
    tl.store(
        rows_ptr(O, row_off, DV, offs_dv), cast(o, O.dtype.element_ty), mask=rows_mask(in_q, offs_dv, DV)
    )
    lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    tl.store(LSE + h.to(tl.int64) * NROWS + bos_q + rows, lse, mask=in_q)


def fwd_config(D: int, dtype: torch.dtype) -> dict:
    """Tile sizes and launch settings of the forward.

    GPU configs (one per case, no autotune): 16-bit D ≤ 64: BM=128, BN=64, 4 warps, 3 stages; 16-bit
    D ≤ 128: BM=128, BN=64, 8 warps, 3 stages (the Triton fused-attention tutorial's Hopper choice);
    fp32 or D > 128: BM=64, BN=32, 4 warps, 2 stages (shared memory). None of them transposes a dot
    accumulator (the Hopper miscompile). Autotuning among 128-key steps (BM 128 × BN 128 at 2 and 3
    stages, BM 64 × BN 128 at 4 warps) gained nothing on the H200 (B=4, T=8192, H=16, D=128: the
    tuner's pick flipped between BN 64 and 128 within one run; BENCHMARKS.md, attention).
    """
    if triton_interpreting():
        return dict(BM=16, BN=16, num_warps=1, num_stages=1)
    if dtype == torch.float32 or D > 128:
        return dict(BM=64, BN=32, num_warps=4, num_stages=2)
    return dict(BM=128, BN=64, num_warps=4 if D <= 64 else 8, num_stages=3)


def varlen_blocks(cu: list[int], bm: int, device) -> torch.Tensor:
    """`[n_blocks, 2]` int32 (sequence, block) pairs covering every sequence of a packed batch."""
    pairs = [(n, m) for n in range(len(cu) - 1) for m in range(triton.cdiv(cu[n + 1] - cu[n], bm))]
    return torch.tensor(pairs or [(0, 0)], dtype=torch.int32, device=device).reshape(-1, 2), len(pairs)


def attn_fwd(
    q, k, v, gate, scale: float, causal: bool, window,
    cu=None, kstride: int = 1, koff: int = 0, qoff: int | None = None,
):  # fmt: skip
    """Launch the forward. q `[B, Tq, HQ, D]`, k `[B, Tk, HKV, D]`, v `[B, Tk, HKV, DV]`.

    `cu` = (cu_q, cu_k) int lists for a packed batch (B == 1) or None. `qoff`: absolute position of
    query row 0 (default Tk − Tq). Returns (o `[B, Tq, HQ, DV]` in v's dtype, lse `[HQ, B·Tq]` fp32,
    log2 units, +inf for rows without keys).
    """
    B, Tq, HQ, D = q.shape
    Tk, DV = k.shape[1], v.shape[3]
    o = new_empty(v, B, Tq, HQ, DV)
    lse = new_empty(q, HQ, B * Tq, dtype=torch.float32)
    cfg = fwd_config(max(D, DV), q.dtype)
    dummy = torch.zeros(2, dtype=torch.int32, device=q.device)
    order = launch_order(causal, window, cu is not None)
    if cu is None:
        grid, cu_q, cu_k, blk = (triton.cdiv(Tq, cfg["BM"]), B * HQ), dummy, dummy, dummy
    else:
        blk, n = varlen_blocks(cu[0], cfg["BM"], q.device)
        grid = (max(n, 1), HQ)
        cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device=q.device) for c in cu)
    gate_mode = 0 if gate is None else (1 if gate.dim() == 4 else 2)
    _attn_fwd_kernel[grid](
        q,
        k,
        v,
        q if gate is None else gate,
        o,
        lse,
        cu_q,
        cu_k,
        blk,
        Tq,
        Tk,
        Tk - Tq if qoff is None else qoff,
        window or 0,
        koff,
        scale * LOG2E,
        B * Tq,
        **head_constexprs(q, k, v),
        CAUSAL=causal,
        HAS_W=window is not None,
        KSTRIDE=kstride,
        GATE_MODE=gate_mode,
        VARLEN=cu is not None,
        DOT_PREC=dot_precision(q.dtype),
        ORDER=order,
        **cfg,
    )
    return o, lse


__all__ = [
    "LOG2E",
    "attn_fwd",
    "dot_precision",
    "fwd_config",
    "launch_order",
    "varlen_blocks",
]
