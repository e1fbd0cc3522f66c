"""Triton KL alignment loss of the lightning indexer over each query's selected keys (the sparse stage
of `loss.dsa_indexer_kl`), forward and backward, registered as `lt2dsl::dsa_kl_fwd` / `dsa_kl_bwd`.

Per query t (one program each, grid `(Tq, B)`), over its selection S_t in chunks of BK slots:

* target P_s = (1/HQ) Σ_h softmax_s(scale · q_h · k_{h's kv head, s}) (q, k fixed);
* logits I_s = Σ_j w_j · ReLU(idx_scale · q_I[t, j] · k_I[s]);
* KL_t = Σ_{s: P_s > 0} P_s (log P_s − I_s + LSE_s(I)).

The forward makes two passes over the selection: the first gives each main head's max and sum, the
second the target, the logits (their log-sum-exp online, the KL kept relative to the running max)
and writes P `[B, Tq, NIDX]` (0 at dropped slots) with (LSE(I), Σ P) per query for the backward,
which needs no main scores: dI_s = g_t (Σ P · softmax(I)_s − P_s). dq_I and dw of a query are its own
program's; dk_I is scattered with fp32 atomics (every query that selected a key adds to it). Dots
are laid out as `[slots, heads]` so a dot result is never transposed into another dot (the Hopper
miscompile `triton_attn` avoids too).

Slots: `IDX` holds indices local to the query's document (`START[t]` its first position, 0 without
packing), sorted per query so a repeated key is its neighbour and counts once; a slot is used iff
0 ≤ idx, START[t] + idx ≤ t's position and < Tk, and it differs from the slot before it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.utils.flop_counter import register_flop_formula

from lt2dsl.kernels.common.custom_op import custom_op

from ..attention.triton_fwd import NEG_BIG
from ..common.attn_triton import dot_precision, mm, pow2
from ..common.backend import new_empty, triton_interpreting

Tensor = torch.Tensor


@triton.jit
def _slots(IDX, START, row, t, i0, NIDX, Tq, Tk, BK: tl.constexpr):
    """(slot numbers j `[BK]`, slot used `[BK]`, key positions in the row `[BK]`) of chunk i0 of
    query t (row b·Tq + t of the `[B·Tq, NIDX]` sorted local indices). A key is read or written only
    under its slot's mask (no `where` on it: Triton 3.6's layout pass fails on that select)."""
    j = i0 + tl.arange(0, BK)
    base = IDX + row.to(tl.int64) * NIDX
    idx = tl.load(base + j, mask=j < NIDX, other=-1)
    prev = tl.load(base + j - 1, mask=(j > 0) & (j < NIDX), other=-1)
    key = tl.load(START + t) + idx
    ok = (idx >= 0) & (key <= t + Tk - Tq) & (key < Tk) & ((j == 0) | (idx != prev))
    return j, ok, key


@triton.jit
def _gather(base, key, ok, STRIDE, offs, WIDTH: tl.constexpr):
    """`[BK, B?]` rows `key` (STRIDE elements apart) of a slab, zero where not `ok`."""
    return tl.load(
        base + (key.to(tl.int64) * STRIDE)[:, None] + offs[None, :],
        mask=ok[:, None] & (offs[None, :] < WIDTH),
        other=0.0,
    )


@triton.jit
def _main_scores(Q, K, b, row, hk, key, ok, Tk, scale, HQ: tl.constexpr, GRP: tl.constexpr,
                 D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, DOT_PREC: tl.constexpr):  # fmt: skip
    """`[BK, BR]` scale · k_s · q_h for the GRP query heads of kv head hk, −inf at unused slots."""
    HKV = HQ // GRP
    r, offs = tl.arange(0, BR), tl.arange(0, BD)
    qrow = (row.to(tl.int64) * HQ + hk * GRP + r)[None, :] * D
    qt = tl.load(Q + qrow + offs[:, None], mask=(r < GRP)[None, :] & (offs < D)[:, None], other=0.0)
    k = _gather(K + (b.to(tl.int64) * Tk * HKV + hk) * D, key, ok, HKV * D, offs, D)
    return tl.where(ok[:, None], mm(k, qt, DOT_PREC) * scale, float("-inf"))


@triton.jit
def _index_dots(QI, KI, WI, b, row, key, ok, Tk, idx_scale, HI: tl.constexpr, DI: tl.constexpr,
                BDI: tl.constexpr, BHI: tl.constexpr, IDX_PREC: tl.constexpr):  # fmt: skip
    """(idx_scale · k_I[s] · q_I[t, j] `[BK, BHI]`, w `[BHI]` fp32 (0 past HI), k_I rows `[BK, BDI]`)."""
    jh, offs = tl.arange(0, BHI), tl.arange(0, BDI)
    qrow = (row.to(tl.int64) * HI + jh)[None, :] * DI
    qit = tl.load(QI + qrow + offs[:, None], mask=(jh < HI)[None, :] & (offs < DI)[:, None], other=0.0)
    w = tl.load(WI + row.to(tl.int64) * HI + jh, mask=jh < HI, other=0.0).to(tl.float32)
    ki = _gather(KI + b.to(tl.int64) * Tk * DI, key, ok, DI, offs, DI)
    return mm(ki, qit, IDX_PREC) * idx_scale, w, ki


@triton.jit
def _kl_fwd_kernel(
    Q, K, QI, KI, WI, IDX, START, KL, P, STATS, Tq, Tk, NIDX, NROWS, scale, idx_scale,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
    BKV: tl.constexpr, HI: tl.constexpr, DI: tl.constexpr, BDI: tl.constexpr, BHI: tl.constexpr,
    BK: tl.constexpr, DOT_PREC: tl.constexpr, IDX_PREC: tl.constexpr,
):  # fmt: skip
    """KL `[B·Tq]`, P `[B·Tq, NIDX]` and STATS `[2, B·Tq]` (LSE(I), +inf for an empty selection; Σ P)."""
    t, b = tl.program_id(0), tl.program_id(1)
    row = b * Tq + t
    HKV = HQ // GRP
    hrow = tl.arange(0, BKV)[:, None]
    # pass 1: max and sum of exp of every main head's scores, rows of [BKV, BR] per kv head
    m_all = tl.full([BKV, BR], NEG_BIG, tl.float32)
    l_all = tl.zeros([BKV, BR], tl.float32)
    for hk in range(HKV):
        m = tl.full([BR], NEG_BIG, tl.float32)
        l = tl.zeros([BR], tl.float32)
        for i0 in range(0, NIDX, BK):
            _, ok, key = _slots(IDX, START, row, t, i0, NIDX, Tq, Tk, BK)
            s = _main_scores(Q, K, b, row, hk, key, ok, Tk, scale, HQ, GRP, D, BD, BR, DOT_PREC)
            m_new = tl.maximum(m, tl.max(s, 0))
            l = l * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new[None, :]), 0)
            m = m_new
        m_all = tl.where(hrow == hk, m[None, :], m_all)
        l_all = tl.where(hrow == hk, l[None, :], l_all)
    in_r = tl.arange(0, BR)[None, :] < GRP
    coef = tl.where(in_r & (l_all > 0), 1.0 / tl.where(l_all > 0, l_all, 1.0), 0.0) / HQ
    # pass 2: target, logits, online LSE(I); acc = Σ P (log P − I + m_i) at the running max m_i
    m_i = tl.full([], NEG_BIG, tl.float32)
    l_i = tl.zeros([], tl.float32)
    acc = tl.zeros([], tl.float32)
    psum = tl.zeros([], tl.float32)
    for i0 in range(0, NIDX, BK):
        j, ok, key = _slots(IDX, START, row, t, i0, NIDX, Tq, Tk, BK)
        p = tl.zeros([BK], tl.float32)
        for hk in range(HKV):
            s = _main_scores(Q, K, b, row, hk, key, ok, Tk, scale, HQ, GRP, D, BD, BR, DOT_PREC)
            m_h = tl.max(tl.where(hrow == hk, m_all, NEG_BIG), 0)
            c_h = tl.sum(tl.where(hrow == hk, coef, 0.0), 0)
            p += tl.sum(tl.exp(s - m_h[None, :]) * c_h[None, :], 1)
        dots, w, _ = _index_dots(QI, KI, WI, b, row, key, ok, Tk, idx_scale, HI, DI, BDI, BHI, IDX_PREC)
        logit = tl.where(ok, tl.sum(tl.maximum(dots, 0.0) * w[None, :], 1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logit, 0))
        l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(logit - m_new), 0)
        acc += psum * (m_new - m_i)
        pos = p > 0  # the only slots of the KL; elsewhere the logit may be −inf
        acc += tl.sum(p * tl.where(pos, tl.log(tl.where(pos, p, 1.0)) - (logit - m_new), 0.0), 0)
        psum += tl.sum(p, 0)
        m_i = m_new
        tl.store(P + row.to(tl.int64) * NIDX + j, p, mask=j < NIDX)
    full = l_i > 0
    log_l = tl.log(tl.where(full, l_i, 1.0))
    tl.store(KL + row, tl.where(psum > 0, acc + psum * log_l, 0.0))
    tl.store(STATS + row, tl.where(full, m_i + log_l, float("inf")))
    tl.store(STATS + NROWS + row, psum)


@triton.jit
def _kl_bwd_kernel(
    QI, KI, WI, IDX, START, P, STATS, DKL, DQI, DKI, DWI, Tq, Tk, NIDX, NROWS, idx_scale,
    HI: tl.constexpr, DI: tl.constexpr, BDI: tl.constexpr, BHI: tl.constexpr, BK: tl.constexpr,
    IDX_PREC: tl.constexpr, GRAD_PREC: tl.constexpr,
):  # fmt: skip
    """dq_I `[B·Tq, HI, DI]`, dw `[B·Tq, HI]` of each query; dk_I (fp32 `[B, Tk, DI]`) added atomically."""
    t, b = tl.program_id(0), tl.program_id(1)
    row = b * Tq + t
    g = tl.load(DKL + row)
    lse = tl.load(STATS + row)
    psum = tl.load(STATS + NROWS + row)
    jh, offs = tl.arange(0, BHI), tl.arange(0, BDI)
    qrow = (row.to(tl.int64) * HI + jh) * DI
    hmask = (jh < HI)[:, None] & (offs < DI)[None, :]
    qi = tl.load(QI + qrow[:, None] + offs[None, :], mask=hmask, other=0.0).to(tl.float32)
    dqt = tl.zeros([BDI, BHI], tl.float32)
    dw = tl.zeros([BHI], tl.float32)
    dk_base = DKI + b.to(tl.int64) * Tk * DI
    for i0 in range(0, NIDX, BK):
        j, ok, key = _slots(IDX, START, row, t, i0, NIDX, Tq, Tk, BK)
        dots, w, ki = _index_dots(QI, KI, WI, b, row, key, ok, Tk, idx_scale, HI, DI, BDI, BHI, IDX_PREC)
        relu = tl.maximum(dots, 0.0)
        soft = tl.where(ok, tl.exp(tl.sum(relu * w[None, :], 1) - lse), 0.0)
        p = tl.load(P + row.to(tl.int64) * NIDX + j, mask=j < NIDX, other=0.0)
        d_logit = g * (psum * soft - p)  # [BK]
        dw += tl.sum(d_logit[:, None] * relu, 0)
        gd = tl.where(dots > 0, d_logit[:, None] * w[None, :] * idx_scale, 0.0)  # [BK, BHI]
        dqt += mm(tl.trans(ki.to(tl.float32)), gd, GRAD_PREC)
        dk = mm(gd, qi, GRAD_PREC)  # [BK, BDI]
        ptr = dk_base + (key.to(tl.int64) * DI)[:, None] + offs[None, :]
        tl.atomic_add(ptr, dk, mask=ok[:, None] & (offs < DI)[None, :], sem="relaxed")
    tl.store(
        DQI + qrow[None, :] + offs[:, None],
        dqt.to(DQI.dtype.element_ty),
        mask=(jh < HI)[None, :] & (offs < DI)[:, None],
    )
    tl.store(DWI + row.to(tl.int64) * HI + jh, dw.to(DWI.dtype.element_ty), mask=jh < HI)


def launch(HI: int, DI: int, dtype: torch.dtype) -> dict:
    """Slots per chunk and launch for index heads HI x DI in `dtype`, none spilling on sm_90: 64 slots
    on 4 warps, halved (on 8 warps) for tiles above 64 x 64 (V3.2's 64 heads of 128) and again for
    fp32 (its exact dots hold their operands in registers); 16 slots, 1 warp under the interpreter."""
    if triton_interpreting():
        return dict(BK=16, num_warps=1, num_stages=1)
    big = pow2(HI) * pow2(DI) > 64 * 64
    BK = (32 if big else 64) // (2 if dtype == torch.float32 else 1)
    return dict(BK=BK, num_warps=4 if BK == 64 else 8, num_stages=2)


def grad_precision(dtype: torch.dtype) -> str:
    """Dots of the backward take fp32 operands (the logit gradients): exact for fp32 inputs, tf32
    (10 mantissa bits, more than the bf16 gradients they make) otherwise."""
    return "ieee" if dtype == torch.float32 or triton_interpreting() else "tf32"


def kl_fwd(q, k, q_idx, k_idx, w_idx, indices, start, scale: float, idx_scale: float):
    """q `[B, Tq, HQ, K]`, k `[B, Tk, HKV, K]` (one dtype), q_idx `[B, Tq, HI, DI]`, k_idx `[B, Tk, DI]`
    (one dtype), w_idx `[B, Tq, HI]`, indices `[B, Tq, NIDX]` local and sorted, start `[Tq]` int64.

    Returns (KL `[B, Tq]`, P `[B, Tq, NIDX]`, stats `[2, B·Tq]`), fp32.
    """
    B, Tq, HQ, D = q.shape
    Tk, HKV = k.shape[1:3]
    HI, DI = q_idx.shape[2:]
    nidx = indices.shape[-1]
    kl = new_empty(q, B, Tq, dtype=torch.float32)
    p = new_empty(q, B, Tq, nidx, dtype=torch.float32)
    stats = new_empty(q, 2, B * Tq, dtype=torch.float32)
    _kl_fwd_kernel[(Tq, B)](
        q, k, q_idx, k_idx, w_idx, indices, start, kl, p, stats, Tq, Tk, nidx, B * Tq, scale, idx_scale,
        HQ=HQ, GRP=HQ // HKV, D=D, BD=pow2(D), BR=pow2(HQ // HKV), BKV=triton.next_power_of_2(HKV),
        HI=HI, DI=DI, BDI=pow2(DI), BHI=pow2(HI), DOT_PREC=dot_precision(q.dtype),
        IDX_PREC=dot_precision(q_idx.dtype), **launch(HI, DI, q_idx.dtype),
    )  # fmt: skip
    return kl, p, stats


def kl_bwd(dkl, q_idx, k_idx, w_idx, indices, start, p, stats, idx_scale: float):
    """(dq_idx, dk_idx, dw_idx) of `kl_fwd` for the upstream gradient `dkl [B, Tq]`."""
    B, Tq, HI, DI = q_idx.shape
    Tk = k_idx.shape[1]
    dq = new_empty(q_idx, *q_idx.shape)
    dw = new_empty(w_idx, *w_idx.shape)
    dk = torch.zeros(k_idx.shape, dtype=torch.float32, device=k_idx.device)
    _kl_bwd_kernel[(Tq, B)](
        q_idx, k_idx, w_idx, indices, start, p, stats, dkl.contiguous(), dq, dk, dw,
        Tq, Tk, indices.shape[-1], B * Tq, idx_scale,
        HI=HI, DI=DI, BDI=pow2(DI), BHI=pow2(HI), IDX_PREC=dot_precision(q_idx.dtype),
        GRAD_PREC=grad_precision(q_idx.dtype), **launch(HI, DI, q_idx.dtype),
    )  # fmt: skip
    return dq, dk.to(k_idx.dtype), dw


@custom_op("lt2dsl::dsa_kl_fwd", mutates_args=())
def dsa_kl_fwd_op(
    q: Tensor, k: Tensor, q_idx: Tensor, k_idx: Tensor, w_idx: Tensor, indices: Tensor, start: Tensor,
    scale: float, idx_scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The indexer's KL over the selected keys: (KL `[B, Tq]`, P `[B, Tq, NIDX]`, stats `[2, B·Tq]`)."""
    return kl_fwd(q, k, q_idx, k_idx, w_idx, indices, start, scale, idx_scale)


@dsa_kl_fwd_op.register_fake
def _(q, k, q_idx, k_idx, w_idx, indices, start, scale, idx_scale):
    B, Tq = q.shape[:2]
    kl = q.new_empty(B, Tq, dtype=torch.float32)
    p = q.new_empty(B, Tq, indices.shape[-1], dtype=torch.float32)
    return kl, p, q.new_empty(2, B * Tq, dtype=torch.float32)


@custom_op("lt2dsl::dsa_kl_bwd", mutates_args=())
def dsa_kl_bwd_op(
    dkl: Tensor, q_idx: Tensor, k_idx: Tensor, w_idx: Tensor, indices: Tensor, start: Tensor, p: Tensor,
    stats: Tensor, idx_scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq_idx, dk_idx, dw_idx) of `dsa_kl_fwd` for the gradient `dkl [B, Tq]` of its KL."""
    return kl_bwd(dkl, q_idx, k_idx, w_idx, indices, start, p, stats, idx_scale)


@dsa_kl_bwd_op.register_fake
def _(dkl, q_idx, k_idx, w_idx, indices, start, p, stats, idx_scale):
    return torch.empty_like(q_idx), torch.empty_like(k_idx), torch.empty_like(w_idx)


def _setup(ctx, inputs, output):
    _, _, q_idx, k_idx, w_idx, indices, start, _, idx_scale = inputs
    ctx.idx_scale = idx_scale
    ctx.save_for_backward(q_idx, k_idx, w_idx, indices, start, *output[1:])


def _backward(ctx, dkl, dp, dstats):
    q_idx, k_idx, w_idx, indices, start, p, stats = ctx.saved_tensors
    dq, dk, dw = dsa_kl_bwd_op(dkl, q_idx, k_idx, w_idx, indices, start, p, stats, ctx.idx_scale)
    return None, None, dq, dk, dw, None, None, None, None


dsa_kl_fwd_op.register_autograd(_backward, setup_context=_setup)


@register_flop_formula(torch.ops.lt2dsl.dsa_kl_fwd)
def _fwd_flops(q, k, q_idx, k_idx, w_idx, indices, *args, **kwargs) -> int:
    """Per query and selected slot (every slot filled): the main scores twice (2 · 2·HQ·K) and the
    index scores once (2·HI·DI)."""
    B, Tq, HQ, K = q
    return 2 * B * Tq * indices[-1] * (2 * HQ * K + q_idx[2] * q_idx[3])


@register_flop_formula(torch.ops.lt2dsl.dsa_kl_bwd)
def _bwd_flops(dkl, q_idx, k_idx, w_idx, indices, *args, **kwargs) -> int:
    """The index scores again, dq_I and dk_I: 3 · 2·HI·DI per query and slot."""
    B, Tq, HI, DI = q_idx
    return 6 * B * Tq * indices[-1] * HI * DI
