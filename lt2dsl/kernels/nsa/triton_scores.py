"""Triton kernel for NSA's block importance: compressed-branch probabilities averaged over a GQA group.

P[b, hk, t, c] = (1/G) Σ_{h in group hk} exp2(s_h(t, c) − lse_h(t)) for visible compressed blocks c
(c·d + l − 1 ≤ pos(t)), 0 otherwise; lse comes from the compressed-branch forward (log2 units), so
these are exactly its softmax probabilities. One program per (query block, b · kv head, key block).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..attention.triton_fwd import LOG2E
from ..common.attn_triton import dot_precision, load_rows, mm, pow2
from ..common.backend import triton_interpreting


@triton.jit
def _group_probs_kernel(
    Q, KC, LSE, P, Tq, NC, qoff, KOFF, qk_scale, NROWS,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, KSTRIDE: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """P `[B, HKV, Tq, NC]` fp32 from Q `[B, Tq, HQ, D]`, KC `[B, NC, HKV, D]`, LSE `[HQ, B·Tq]`."""
    HKV = HQ // GRP
    i_m, pid, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, hk = pid // HKV, pid % HKV
    rows = i_m * BM + tl.arange(0, BM)
    in_q = rows < Tq
    pos = rows + qoff
    cols = i_n * BN + tl.arange(0, BN)
    offs = tl.arange(0, BD)
    kt = tl.load(
        KC + ((b * NC + cols) * HKV + hk).to(tl.int64)[None, :] * D + offs[:, None],
        mask=(cols < NC)[None, :] & (offs[:, None] < D),
        other=0.0,
    )
    ok = in_q[:, None] & (cols < NC)[None, :] & (cols[None, :] * KSTRIDE + KOFF <= pos[:, None])
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for g in range(GRP):
        h = hk * GRP + g
        q = load_rows(Q, ((b * Tq + rows) * HQ + h).to(tl.int64), D, in_q, offs, D)
        lse = tl.load(LSE + h.to(tl.int64) * NROWS + b * Tq + rows, mask=in_q, other=float("inf"))
        acc += tl.where(ok, tl.exp2(mm(q, kt, DOT_PREC) * qk_scale - lse[:, None]), 0.0)
    out = P + ((b * HKV + hk) * Tq + rows).to(tl.int64)[:, None] * NC + cols[None, :]
    tl.store(out, acc / GRP, mask=in_q[:, None] & (cols < NC)[None, :])


def group_probs(q, k_cmp, lse, scale: float, qoff: int, stride: int, koff: int) -> torch.Tensor:
    """`[B, HKV, Tq, NC]` group-averaged compressed probabilities (see module docstring)."""
    B, Tq, HQ, D = q.shape
    NC, HKV = k_cmp.shape[1], k_cmp.shape[2]
    p = torch.empty(B, HKV, Tq, NC, device=q.device, dtype=torch.float32)
    BM, BN = (16, 16) if triton_interpreting() else (64, 64)
    grid = (triton.cdiv(Tq, BM), B * HKV, triton.cdiv(NC, BN))
    _group_probs_kernel[grid](
        q,
        k_cmp,
        lse,
        p,
        Tq,
        NC,
        qoff,
        koff,
        scale * LOG2E,
        B * Tq,
        HQ=HQ,
        GRP=HQ // HKV,
        D=D,
        BD=pow2(D),
        BM=BM,
        BN=BN,
        KSTRIDE=stride,
        DOT_PREC=dot_precision(q.dtype),
        num_warps=1 if triton_interpreting() else 4,
    )
    return p
