"""Triton decode: a few new queries over a KV cache, split across programs (flash-decoding).

Split kernel: program (b·HKV + kv head, split) takes the G·Tq query rows that read that kv head (GQA
rows stacked into one tile) and a contiguous chunk of cache slots, and writes an unnormalised partial
(o, lse). Combine kernel: merges the splits of each (b, kv head) by their lse and applies the gate.
Slot positions follow `decode.py`: slot j holds position j (linear) or n − 1 − ((n − 1 − j) mod L)
(ring buffer); the causal and window masks are on those positions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.attn_triton import dot_precision, load_rows, mm, pow2, softmax_init, softmax_step
from ..common.attn_utils import rows_contiguous
from ..common.backend import check_triton_dtype, new_empty, triton_interpreting
from .triton_fwd import LOG2E, NEG_BIG


@triton.jit
def _kv_program(HQ: tl.constexpr, GRP: tl.constexpr):
    """(program_id(0), program_id(1), batch, kv head) of a program on a `(B·HKV, ·)` grid."""
    HKV = HQ // GRP
    pid, j = tl.program_id(0), tl.program_id(1)
    return pid, j, pid // HKV, pid % HKV


@triton.jit
def _decode_split_kernel(
    Q, K, V, SEQLENS, O_PART, LSE_PART, L, CHUNK, W, qk_scale, SKB, SKL, SKH, SVB, SVL, SVH,
    Tq: tl.constexpr, HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, NSPLIT: tl.constexpr,
    HAS_W: tl.constexpr, RING: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Partial attention of rows (t, g) of kv head `hk` over slots [split·CHUNK, (split+1)·CHUNK)."""
    pid, split, b, hk = _kv_program(HQ, GRP)
    n = tl.load(SEQLENS + b).to(tl.int32)
    r = tl.arange(0, BR)
    t, g = r // GRP, r % GRP
    in_r = r < Tq * GRP
    qpos = n - Tq + t
    offs_d, offs_dv = tl.arange(0, BD), tl.arange(0, BDV)
    q_off = ((b * Tq + t) * HQ + hk * GRP + g).to(tl.int64)
    q = load_rows(Q, q_off, D, in_r, offs_d, D)
    # element strides (batch, slot, head) of the caches, whose last dim is contiguous: a view of a
    # larger reserved buffer or a head-major layout is read in place, never copied per step
    k_base = K + b.to(tl.int64) * SKB + hk.to(tl.int64) * SKH
    v_base = V + b.to(tl.int64) * SVB + hk.to(tl.int64) * SVH
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, tl.minimum(L, n))
    if not RING and HAS_W:  # a linear cache: skip slots older than every query's window
        start = tl.maximum(start, ((n - Tq - W + 1) // BN) * BN)
    acc, m_i, l_i = softmax_init(BR, BDV, NEG_BIG)
    for j0 in range(start, end, BN):
        j = j0 + tl.arange(0, BN)
        in_j = j < end
        kt = tl.load(
            k_base + (j.to(tl.int64) * SKL)[None, :] + offs_d[:, None],
            mask=in_j[None, :] & (offs_d[:, None] < D),
            other=0.0,
        )
        s = mm(q, kt, DOT_PREC) * qk_scale
        pos = j
        if RING:
            pos = (n - 1) - ((n - 1 - j) % L)
        ok = in_j[None, :] & in_r[:, None] & (pos[None, :] <= qpos[:, None]) & (pos[None, :] >= 0)
        if HAS_W:
            ok = ok & (pos[None, :] > qpos[:, None] - W)
        s = tl.where(ok, s, float("-inf"))
        m_new, alpha, p, l_i = softmax_step(s, m_i, l_i)
        v = tl.load(
            v_base + (j.to(tl.int64) * SVL)[:, None] + offs_dv[None, :],
            mask=in_j[:, None] & (offs_dv[None, :] < DV),
            other=0.0,
        )
        acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, DOT_PREC)
        m_i = m_new
    part = (pid * NSPLIT + split).to(tl.int64) * BR + r
    tl.store(O_PART + part[:, None] * BDV + offs_dv[None, :], acc / tl.where(l_i > 0, l_i, 1.0)[:, None])
    tl.store(LSE_PART + part, tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf")))


@triton.jit
def _decode_combine_kernel(
    O_PART, LSE_PART, GATE, O,
    Tq: tl.constexpr, HQ: tl.constexpr, GRP: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr,
    BR: tl.constexpr, NSPLIT: tl.constexpr, BS: tl.constexpr, GATE_MODE: tl.constexpr,
):  # fmt: skip
    """Merge the NSPLIT partials of one (b, kv head, row) by their lse; apply σ(gate)."""
    pid, r, b, hk = _kv_program(HQ, GRP)
    t, g = r // GRP, r % GRP
    sp = tl.arange(0, BS)
    part = (pid * NSPLIT + sp).to(tl.int64) * BR + r
    lse = tl.load(LSE_PART + part, mask=sp < NSPLIT, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(lse > float("-inf"), tl.exp2(lse - tl.where(m > float("-inf"), m, 0.0)), 0.0)
    offs = tl.arange(0, BDV)
    o_part = tl.load(O_PART + part[:, None] * BDV + offs[None, :], mask=(sp < NSPLIT)[:, None], other=0.0)
    den = tl.sum(w, 0)
    o = tl.sum(o_part * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    row = ((b * Tq + t) * HQ + hk * GRP + g).to(tl.int64)
    if GATE_MODE == 1:
        o = o * tl.sigmoid(tl.load(GATE + row * DV + offs, mask=offs < DV, other=0.0).to(tl.float32))
    if GATE_MODE == 2:
        o = o * tl.sigmoid(tl.load(GATE + row).to(tl.float32))
    tl.store(O + row * DV + offs, o.to(O.dtype.element_ty), mask=offs < DV)


def _splits(B: int, HKV: int, L: int, BN: int, device) -> tuple[int, int]:
    """(n_split, chunk): enough programs to fill the GPU (≈4 per SM), at least BN slots each."""
    if triton_interpreting():
        chunk = max(BN, triton.cdiv(triton.cdiv(L, 2), BN) * BN)
        return triton.cdiv(L, chunk), chunk
    n_sm = torch.cuda.get_device_properties(device).multi_processor_count
    want = max(1, min(triton.cdiv(4 * n_sm, B * HKV), triton.cdiv(L, 4 * BN)))
    chunk = triton.cdiv(triton.cdiv(L, want), BN) * BN
    return triton.cdiv(L, chunk), chunk


def attention_decode_triton(q, k_cache, v_cache, cache_seqlens, *, window, ring: bool, gate, scale: float):
    """Triton `attention_decode` (forward only). Shapes as in `decode.attention_decode`."""
    check_triton_dtype(q, k_cache)
    q, k_cache, v_cache = q.contiguous(), rows_contiguous(k_cache), rows_contiguous(v_cache)
    B, Tq, HQ, D = q.shape
    L, HKV, DV = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    grp = HQ // HKV
    BR, BDV = pow2(Tq * grp), pow2(DV)
    BN = 16 if triton_interpreting() else 64
    nsplit, chunk = _splits(B, HKV, L, BN, q.device)
    o_part = new_empty(q, B * HKV * nsplit * BR, BDV, dtype=torch.float32)
    lse_part = new_empty(q, B * HKV * nsplit * BR, dtype=torch.float32)
    seqlens = cache_seqlens.to(device=q.device, dtype=torch.int32)
    _decode_split_kernel[(B * HKV, nsplit)](
        q,
        k_cache,
        v_cache,
        seqlens,
        o_part,
        lse_part,
        L,
        chunk,
        window or 0,
        scale * LOG2E,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        Tq=Tq,
        HQ=HQ,
        GRP=grp,
        D=D,
        DV=DV,
        BD=pow2(D),
        BDV=BDV,
        BR=BR,
        BN=BN,
        NSPLIT=nsplit,
        HAS_W=window is not None,
        RING=ring,
        DOT_PREC=dot_precision(q.dtype),
        num_warps=1 if triton_interpreting() else 4,
        num_stages=1 if triton_interpreting() else 3,
    )
    o = new_empty(v_cache, B, Tq, HQ, DV)
    gate_mode = 0 if gate is None else (1 if gate.dim() == 4 else 2)
    _decode_combine_kernel[(B * HKV, Tq * grp)](
        o_part,
        lse_part,
        q if gate is None else gate.contiguous(),
        o,
        Tq=Tq,
        HQ=HQ,
        GRP=grp,
        DV=DV,
        BDV=BDV,
        BR=BR,
        NSPLIT=nsplit,
        BS=triton.next_power_of_2(nsplit),
        GATE_MODE=gate_mode,
        num_warps=1 if triton_interpreting() else 4,
    )
    return o
