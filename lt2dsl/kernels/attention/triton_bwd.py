"""Triton backward of `attention` (FlashAttention-2 style: preprocess, dK/dV kernel, dQ kernel).

Gate algebra (no ungated output is stored): with o = σ(g) ⊙ u and upstream gradient dO,
  dU = dO ⊙ σ(g),   D_i = Σ dU ⊙ u = Σ dO ⊙ o,   dg = dO ⊙ o ⊙ (1 − σ(g))  (headwise: D_i (1 − σ(g))),
so the preprocess reads dO, o and g once and writes dU, D and dg. dK/dV: one program per key block and
kv head loops over the G query heads of its group (no atomics); dQ: one program per query block.
Both recompute p = exp2(s·scale·log2e − lse). Hopper notes: pᵀ and dsᵀ are computed directly as
k qᵀ and v dOᵀ from transposed loads, so no dot result is transposed before feeding another dot.

dQ from dS (the default without a window): the dK/dV kernel also writes each dsᵀ tile, already
rounded to the input dtype for its dK dot, to a key-major dS; dQ = dS K is then one dot per tile
that streams dS (2 bytes per 256 FLOPs at D = 128) instead of the split kernel's three dots that
recompute p and dp. The numbers are the split kernel's: it rounds the same ds before its dot. The
buffer is bounded (`ds_group_heads`); larger problems run in groups of heads through it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.attn_triton import dot_precision, head_constexprs, load_rows, mm, pow2, rows_mask, rows_ptr
from ..common.backend import autotuned_on_gpu, forced_autotune_config, new_empty, triton_interpreting
from ..common.tiles import config_table
from ..common.tl_util import cast
from .recipe import AttnRecipe, default_recipe, ds_applies
from .triton_fwd import (
    LOG2E,
    _program_ids,
    _seq_bounds,
    band_part,
    launch_order,
    load_keys_t,
    query_band,
    query_block,
    varlen_blocks,
    visible,
)


@triton.jit
def _bwd_pre_kernel(
    O,
    DO,
    GATE,
    DU,
    DG,
    DELTA,
    NROWS,
    HQ: tl.constexpr,
    DV: tl.constexpr,
    BDV: tl.constexpr,
    BM: tl.constexpr,
    GATE_MODE: tl.constexpr,
):
    """D = Σ_v dO ⊙ o per row; with a gate also dU = dO ⊙ σ(g) and dg. Rows are (token, head)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    h = tl.program_id(1)
    in_r = rows < NROWS
    offs = tl.arange(0, BDV)
    m2 = in_r[:, None] & (offs[None, :] < DV)
    ptr = (rows.to(tl.int64) * HQ + h)[:, None] * DV + offs[None, :]
    o = tl.load(O + ptr, mask=m2, other=0.0).to(tl.float32)
    do = tl.load(DO + ptr, mask=m2, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    tl.store(DELTA + h.to(tl.int64) * NROWS + rows, delta, mask=in_r)
    if GATE_MODE == 1:
        sg = tl.sigmoid(tl.load(GATE + ptr, mask=m2, other=0.0).to(tl.float32))
        tl.store(DG + ptr, cast(do * o * (1.0 - sg), DG.dtype.element_ty), mask=m2)
        tl.store(DU + ptr, cast(do * sg, DU.dtype.element_ty), mask=m2)
    if GATE_MODE == 2:
        gptr = rows.to(tl.int64) * HQ + h
        sg = tl.sigmoid(tl.load(GATE + gptr, mask=in_r, other=0.0).to(tl.float32))
        tl.store(DG + gptr, cast(delta * (1.0 - sg), DG.dtype.element_ty), mask=in_r)
        tl.store(DU + ptr, cast(do * sg[:, None], DU.dtype.element_ty), mask=m2)


@triton.jit
def _store_dq(DQ, row_off, in_q, offs_d, D: tl.constexpr, dq, scale):
    """dq · scale `[BM, BD]` into rows `row_off` of DQ, in DQ's dtype (pointers, value, mask in turn)."""
    tl.store(
        rows_ptr(DQ, row_off, D, offs_d),
        cast(dq * scale, DQ.dtype.element_ty),
        mask=rows_mask(in_q, offs_d, D),
    )


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DU, LSE, DELTA, DQ, CU_Q, CU_K, BLK_MAP,
    Tq, Tk, qoff, W, KOFF, qk_scale, scale, NROWS,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, HAS_W: tl.constexpr,
    KSTRIDE: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr, ORDER: tl.constexpr,
):  # fmt: skip
    """dQ of BM query rows of one head; same program layout and key band as the forward."""
    h, hk, i_m, bos_q, bos_k, Tq_n, Tk_n, qo, rows, in_q, qpos, offs_d, offs_dv, row_off = query_block(
        CU_Q, CU_K, BLK_MAP, Tq, Tk, qoff, HQ, GRP, BD, BDV, BM, VARLEN, ORDER
    )
    HKV = HQ // GRP
    q = load_rows(Q, row_off, D, in_q, offs_d, D)
    do = load_rows(DU, row_off, DV, in_q, offs_dv, DV)
    lse = tl.load(LSE + h.to(tl.int64) * NROWS + bos_q + rows, mask=in_q, other=float("inf"))
    delta = tl.load(DELTA + h.to(tl.int64) * NROWS + bos_q + rows, mask=in_q, other=0.0)
    k_ptr = K + (bos_k.to(tl.int64) * HKV + hk) * D
    v_ptr = V + (bos_k.to(tl.int64) * HKV + hk) * DV
    lo, full_lo, full_hi, hi = query_band(i_m, Tq_n, qo, Tk_n, W, KOFF, BM, BN, CAUSAL, HAS_W, KSTRIDE)
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    for PART in tl.static_range(3):
        start, end = band_part(PART, lo, full_lo, full_hi, hi)
        # dq += ds k over the part's key blocks, ds = p (dp − D)
        for n in range(start, end, BN):
            offs_n = n + tl.arange(0, BN)
            in_k = offs_n < Tk_n
            kt = load_keys_t(k_ptr, offs_n, in_k, HKV * D, offs_d, D)
            vt = load_keys_t(v_ptr, offs_n, in_k, HKV * DV, offs_dv, DV)
            p = tl.exp2(mm(q, kt, DOT_PREC) * qk_scale - lse[:, None])
            if PART != 1:
                ok = visible(offs_n, in_k, qpos, W, KOFF, CAUSAL, HAS_W, KSTRIDE)
                p = tl.where(ok, p, 0.0)
            dp = mm(do, vt, DOT_PREC)
            ds = p * (dp - delta[:, None])
            dq += mm(cast(ds, kt.dtype), tl.trans(kt), DOT_PREC)
    _store_dq(DQ, row_off, in_q, offs_d, D, dq, scale)


@triton.jit
def _bwd_dq_ds_kernel(
    DS, K, DQ, Tq, Tk, qoff, scale, BH0,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr, ORDER: tl.constexpr,
):  # fmt: skip
    """dQ = dS K for BM query rows of query head (BH0 · GRP + program_id(1)) of a group, from the
    key-major dS the dK/dV kernel wrote: one dot per tile (the split dQ kernel's three)."""
    pid_m, pid_l = _program_ids(ORDER)
    qp = BH0 * GRP + pid_l
    b = qp // HQ
    h = qp % HQ
    HKV = HQ // GRP
    rows = pid_m * BM + tl.arange(0, BM)
    in_q = rows < Tq
    qpos = rows + qoff
    offs_d = tl.arange(0, BD)
    lo, full_lo, full_hi, hi = query_band(pid_m, Tq, qoff, Tk, 0, 0, BM, BN, CAUSAL, False, 1)
    ds_base = DS + pid_l.to(tl.int64) * Tk * Tq
    k_ptr = K + ((b * Tk).to(tl.int64) * HKV + h // GRP) * D
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    for PART in tl.static_range(1, 3):  # part 0 is empty: no window, so `_band` gives lo = full_lo
        start, end = band_part(PART, lo, full_lo, full_hi, hi)
        # dq += ds k over the part's key blocks, ds read from the key-major dS
        for n in range(start, end, BN):
            keys = n + tl.arange(0, BN)
            in_k = keys < Tk
            ok = in_q[:, None] & in_k[None, :]
            if PART != 1 and CAUSAL:
                # the dK/dV kernel wrote every causal pair; the rest of a tile is never read
                ok = ok & (keys[None, :] <= qpos[:, None])
            ds = tl.load(ds_base + keys[None, :].to(tl.int64) * Tq + rows[:, None], mask=ok, other=0.0)
            k = tl.load(
                k_ptr + keys[:, None].to(tl.int64) * (HKV * D) + offs_d[None, :],
                mask=in_k[:, None] & (offs_d[None, :] < D),
                other=0.0,
            )
            dq += mm(ds, k, DOT_PREC)
    row_off = ((b * Tq + rows) * HQ + h).to(tl.int64)
    _store_dq(DQ, row_off, in_q, offs_d, D, dq, scale)


@triton.jit
def _row_band(
    k0,
    k1,
    Tq_n,
    qo,
    W,
    KOFF,
    BM: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_W: tl.constexpr,
    KSTRIDE: tl.constexpr,
):
    """Query-row ranges that see keys [k0, k1): (lo, full_lo, full_hi, hi), as `_band` for rows."""
    kmin = k0 * KSTRIDE + KOFF
    kmax = (k1 - 1) * KSTRIDE + KOFF
    lo = 0
    full_lo = 0
    hi = Tq_n
    full_hi = (Tq_n // BM) * BM
    if CAUSAL:
        lo = (tl.maximum(kmin - qo, 0) // BM) * BM
        full_lo = tl.cdiv(tl.maximum(kmax - qo, 0), BM) * BM
        if KSTRIDE != 1:
            full_lo = lo
            full_hi = lo
    if HAS_W:
        hi = tl.minimum(Tq_n, tl.maximum(kmax + W - qo, 0))
        full_hi = tl.minimum(full_hi, (tl.maximum(kmin + W - qo, 0) // BM) * BM)
    full_lo = tl.maximum(full_lo, lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DU, LSE, DELTA, DK, DV_OUT, DS, CU_Q, CU_K, BLK_MAP,
    Tq, Tk, qoff, W, KOFF, qk_scale, scale, NROWS, BH0,
    HQ: tl.constexpr, GRP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, HAS_W: tl.constexpr,
    KSTRIDE: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr, ORDER: tl.constexpr,
    STORE_DS: tl.constexpr,
):  # fmt: skip
    """dK, dV of BN keys of one kv head, summed over the GRP query heads that read it.

    With STORE_DS the programs are the kv heads BH0 + program_id(1) of a group, and each query
    head's dS is written key-major to DS (`[GRP · heads of the group, Tk, Tq]`) for `_bwd_dq_ds_kernel`.
    """
    HKV = HQ // GRP
    pid_n, pid_bh = _program_ids(ORDER)
    pid_bh += BH0
    b, hk, i_n, bos_q, bos_k, Tq_n, Tk_n, qo = _seq_bounds(
        pid_n, pid_bh, CU_K, CU_Q, BLK_MAP, Tk, Tq, qoff, HKV, VARLEN
    )
    if VARLEN:  # _seq_bounds was called with q/k swapped to map key blocks; swap back
        bos_q, bos_k, Tq_n, Tk_n = bos_k, bos_q, Tk_n, Tq_n
        qo = Tk_n - Tq_n
    else:
        bos_q, bos_k = b * Tq, b * Tk
        Tq_n, Tk_n, qo = Tq, Tk, qoff
    keys = i_n * BN + tl.arange(0, BN)
    in_k = keys < Tk_n
    kpos = keys * KSTRIDE + KOFF
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    k_off = ((bos_k + keys) * HKV + hk).to(tl.int64)
    k = tl.load(
        K + k_off[:, None] * D + offs_d[None, :], mask=in_k[:, None] & (offs_d[None, :] < D), other=0.0
    )
    v = tl.load(
        V + k_off[:, None] * DV + offs_dv[None, :], mask=in_k[:, None] & (offs_dv[None, :] < DV), other=0.0
    )
    dk = tl.zeros([BN, BD], dtype=tl.float32)
    dv = tl.zeros([BN, BDV], dtype=tl.float32)
    lo, full_lo, full_hi, hi = _row_band(
        i_n * BN, tl.minimum(i_n * BN + BN, Tk_n), Tq_n, qo, W, KOFF, BM, CAUSAL, HAS_W, KSTRIDE
    )
    for g in range(GRP):
        h = hk * GRP + g
        # a scalar base and int32 offsets: a tile of 64-bit pointers held across the loop spilled
        ds_blk = DS + (((pid_bh - BH0) * GRP + g).to(tl.int64) * Tk + i_n * BN) * Tq
        ds_rows = tl.arange(0, BN)[:, None] * Tq
        q_ptr = Q + (bos_q.to(tl.int64) * HQ + h) * D
        do_ptr = DU + (bos_q.to(tl.int64) * HQ + h) * DV
        lse_ptr = LSE + h.to(tl.int64) * NROWS + bos_q
        delta_ptr = DELTA + h.to(tl.int64) * NROWS + bos_q
        for PART in tl.static_range(3):
            start, end = band_part(PART, lo, full_lo, full_hi, hi)
            # dv += pᵀ dU, dk += dsᵀ q over the part's query-row blocks; with STORE_DS each dsᵀ
            # tile also goes to this key block's rows of the key-major dS
            for m in range(start, end, BM):
                rows = m + tl.arange(0, BM)
                in_q = rows < Tq_n
                roff = rows.to(tl.int64) * HQ
                qt = tl.load(
                    q_ptr + roff[None, :] * D + offs_d[:, None],
                    mask=in_q[None, :] & (offs_d[:, None] < D),
                    other=0.0,
                )
                do = tl.load(
                    do_ptr + roff[:, None] * DV + offs_dv[None, :],
                    mask=in_q[:, None] & (offs_dv[None, :] < DV),
                    other=0.0,
                )
                lse = tl.load(lse_ptr + rows, mask=in_q, other=float("inf"))
                delta = tl.load(delta_ptr + rows, mask=in_q, other=0.0)
                pt = tl.exp2(mm(k, qt, DOT_PREC) * qk_scale - lse[None, :])
                if PART != 1:
                    qpos = rows + qo
                    ok = in_k[:, None] & in_q[None, :]
                    if CAUSAL:
                        ok = ok & (kpos[:, None] <= qpos[None, :])
                    if HAS_W:
                        ok = ok & (kpos[:, None] > qpos[None, :] - W)
                    pt = tl.where(ok, pt, 0.0)
                dv += mm(cast(pt, do.dtype), do, DOT_PREC)
                dpt = mm(v, tl.trans(do), DOT_PREC)
                dst = cast(pt * (dpt - delta[None, :]), qt.dtype)
                if STORE_DS:
                    tl.store(ds_blk + (ds_rows + rows[None, :]), dst, mask=in_k[:, None] & in_q[None, :])
                dk += mm(dst, tl.trans(qt), DOT_PREC)
    tl.store(
        DK + k_off[:, None] * D + offs_d[None, :],
        cast(dk * scale, DK.dtype.element_ty),
        mask=in_k[:, None] & (offs_d[None, :] < D),
    )
    tl.store(
        DV_OUT + k_off[:, None] * DV + offs_dv[None, :],
        cast(dv, DV_OUT.dtype.element_ty),
        mask=in_k[:, None] & (offs_dv[None, :] < DV),
    )


def bwd_config(D: int, dtype: torch.dtype) -> dict:
    """Fixed tiles of the two backward kernels, for the cases the autotuned lists do not serve.

    fp32 or D > 128: 32 × 32 tiles, 4 warps. Variable-length batches (their block map is built for
    one tile size) and every other 16-bit case: the first entry of each autotune list. No transposed
    dot accumulator feeds a dot (the Hopper miscompile needs exactly that pattern); 64-wide tiles are
    where the peer saw it, so the GPU tests force every listed config (tests/kernels/test_attention.py).
    """
    if triton_interpreting():
        # the dS path's dQ tile differs from the dK/dV tile: the tests then check that the two
        # kernels agree on dS's addressing, not on a shared tiling
        return dict(
            kv=dict(BN=16, BM=16, num_warps=1, num_stages=1),
            q=dict(BM=16, BN=16, num_warps=1, num_stages=1),
            ds=dict(BM=32, BN=16, num_warps=1, num_stages=1),
        )
    if dtype == torch.float32 or D > 128:
        small = dict(BN=32, BM=32, num_warps=4, num_stages=1)
        return dict(kv=small, q=small, ds=small)
    return dict(kv=_as_dict(KV_CONFIGS[0]), q=_as_dict(Q_CONFIGS[0]), ds=_as_dict(DS_CONFIGS[0]))


# 16-bit, D ≤ 128, fixed-length batches: the tiles are autotuned on the GPU. The H200 profile of
# B=4, T=8192, H=16, D=128 with the first entries alone: dK/dV 8.7 ms, dQ 2.8 ms, forward 2.4 ms;
# dK/dV does 2x the forward's matmul work, so it ran at ~55% of the forward's rate. Larger key
# tiles (128) halve the re-reads of q, dO, lse and D per key and are FlashAttention-2's choice at
# head dim 128 (64 x 128 tiles, 8 warps); larger query tiles do the same for dQ.
# rows: (BN, BM, warps, stages)
KV_CONFIGS = config_table(("BN", "BM"), [
    (64, 64, 8, 2), (128, 32, 8, 2), (128, 64, 8, 2), (128, 32, 8, 3), (64, 32, 4, 2),
    # offline sm_90: 72 B of spills (64 x 64, 8 warps, 3 stages); 104 B (128 x 64, 3 stages: fewer
    # than its 2-stage twin's 224), 120 B with the dS store
    (64, 64, 8, 3), (128, 64, 8, 3),
])  # fmt: skip
# rows: (BM, BN, warps, stages); the last one: 233 registers, no spills
Q_CONFIGS = config_table(("BM", "BN"), [
    (64, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2), (64, 32, 4, 3), (128, 64, 8, 3),
])  # fmt: skip
# The dK/dV kernel writing dS holds one more tile through the loop (the 16-bit dsᵀ, converted to a
# row-contiguous layout for 16-byte stores), so it runs the same list. Offline sm_90 the 128 x 64
# 2-stage tile spills 536 B per thread with the integer arguments unaligned (T = 1000) but 272 B
# with them divisible by 16, as the JIT specialises T = 8192, where it is the tuner's pick on the
# GPU (0.6 ms of fwd+bwd faster than the 64 x 32 tile; BENCHMARKS.md, attention).
KV_DS_CONFIGS = KV_CONFIGS
# dQ = dS K reads 2 bytes of dS per 256 FLOPs (D = 128): below the H200's ~180 FLOP/byte ridge, so
# the tiles are chosen for streaming dS (deep pipelines) more than for the dots.
DS_CONFIGS = config_table(("BM", "BN"), [
    (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 3), (64, 64, 4, 4), (128, 128, 8, 3), (128, 64, 8, 4),
])  # fmt: skip
_KEY = ["HQ", "GRP", "D", "DV", "CAUSAL", "HAS_W", "KSTRIDE", "DOT_PREC", "ORDER", "STORE_DS"]
_DS_KEY = ["HQ", "GRP", "D", "CAUSAL", "DOT_PREC", "ORDER"]


def _as_dict(c: triton.Config) -> dict:
    return dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)


_dkdv_tuned = autotuned_on_gpu(_bwd_dkdv_kernel, KV_CONFIGS, _KEY)
_dkdv_ds_tuned = autotuned_on_gpu(_bwd_dkdv_kernel, KV_DS_CONFIGS, _KEY)
_dq_tuned = autotuned_on_gpu(_bwd_dq_kernel, Q_CONFIGS, _KEY[:-1])
_dq_ds_tuned = autotuned_on_gpu(_bwd_dq_ds_kernel, DS_CONFIGS, _DS_KEY)
N_BWD_CONFIGS = max(len(KV_CONFIGS), len(Q_CONFIGS), len(DS_CONFIGS))


def forced_bwd_config(i: int):
    """The autotuned backward kernels run config i of their lists (see `forced_autotune_config`)."""
    tuned = (_dkdv_tuned, _dq_tuned, _dkdv_ds_tuned, _dq_ds_tuned)
    return forced_autotune_config([t for t in tuned if t is not None], i)


def ds_group_heads(recipe: AttnRecipe, B: int, HQ: int, HKV: int, Tq: int, Tk: int, ref: torch.Tensor) -> int:
    """KV heads (of the B·HKV) per launch of the dS path, 0 for the split dQ kernel: the recipe's, or
    one kv head's dS over `recipe.ds_bytes` (at most a quarter of the device memory free at the call).

    Causal dS fills half of each [Tk, Tq] slab, but a slab is addressed densely so any tile
    sizes of the two kernels agree on it; larger problems run in groups of heads through one buffer.
    """
    if recipe.dq != "ds":
        return 0
    budget = recipe.ds_bytes
    if ref.is_cuda:
        budget = min(budget, torch.cuda.mem_get_info(ref.device)[0] // 4)
    per_kv = (HQ // HKV) * Tq * Tk * ref.element_size()
    return min(B * HKV, budget // per_kv) if per_kv else 0


def _bwd_ds(q, k, v, du, lse, delta, dq, dk, dv, dummy, scalars, common, cfg, tuned, group, o_q):
    """dK, dV and dS by the dK/dV kernel, then dQ = dS K, over groups of `group` kv heads."""
    B, Tq, HQ, D = q.shape
    Tk, HKV = k.shape[1], k.shape[2]
    GRP = HQ // HKV
    ds = torch.empty(group * GRP, Tk, Tq, dtype=q.dtype, device=q.device)
    qk = dict(
        HQ=HQ, GRP=GRP, D=D, BD=pow2(D), CAUSAL=common["CAUSAL"], DOT_PREC=common["DOT_PREC"], ORDER=o_q
    )
    q_scalars = (Tq, Tk, scalars[2], scalars[6])
    for g0 in range(0, B * HKV, group):
        n = min(group, B * HKV - g0)
        args = (q, k, v, du, lse, delta, dk, dv, ds, dummy, dummy, dummy, *scalars, g0)
        if tuned:
            _dkdv_ds_tuned[lambda m, n=n: (triton.cdiv(Tk, m["BN"]), n)](
                *args, ORDER=0, STORE_DS=True, **common
            )
            _dq_ds_tuned[lambda m, n=n: (triton.cdiv(Tq, m["BM"]), n * GRP)](ds, k, dq, *q_scalars, g0, **qk)
            continue
        ckv, cq = cfg["kv"], cfg["ds"]
        _bwd_dkdv_kernel[(triton.cdiv(Tk, ckv["BN"]), n)](*args, ORDER=0, STORE_DS=True, **ckv, **common)
        _bwd_dq_ds_kernel[(triton.cdiv(Tq, cq["BM"]), n * GRP)](ds, k, dq, *q_scalars, g0, **cq, **qk)


def bwd_preprocess(o, do, gate):
    """(delta `[HQ, B·Tq]` fp32, dU, dgate or None) of the gated output o `[B, Tq, HQ, DV]` and its
    gradient do: delta = Σ_v dO ⊙ o per row, dU = dO ⊙ σ(g) (do itself without a gate)."""
    B, Tq, HQ, DV = o.shape
    nrows = B * Tq
    delta = new_empty(o, HQ, nrows, dtype=torch.float32)
    du = do if gate is None else new_empty(do, *do.shape)
    dg = None if gate is None else new_empty(gate, *gate.shape)
    pre_bm = 16 if triton_interpreting() else 64
    _bwd_pre_kernel[(triton.cdiv(nrows, pre_bm), HQ)](
        o,
        do,
        o if gate is None else gate,
        du,
        do if dg is None else dg,
        delta,
        nrows,
        HQ=HQ,
        DV=DV,
        BDV=pow2(DV),
        BM=pre_bm,
        GATE_MODE=0 if gate is None else (1 if gate.dim() == 4 else 2),
    )
    return delta, du, dg


def attn_bwd(
    do, q, k, v, o, lse, gate, scale: float, causal: bool, window,
    cu=None, kstride: int = 1, koff: int = 0, qoff: int | None = None, recipe: AttnRecipe | None = None,
):  # fmt: skip
    """Gradients (dq, dk, dv, dgate) of `attn_fwd`'s output `o` (the gated one) for upstream `do`,
    by `recipe` (default: `default_recipe` of the call)."""
    B, Tq, HQ, D = q.shape
    Tk, HKV, DV = k.shape[1], k.shape[2], v.shape[3]
    nrows = B * Tq
    delta, du, dg = bwd_preprocess(o, do, gate)
    cfg = bwd_config(max(D, DV), q.dtype)
    dq, dk, dv = (new_empty(t, *t.shape) for t in (q, k, v))
    dummy = torch.zeros(2, dtype=torch.int32, device=q.device)
    common = dict(
        **head_constexprs(q, k, v),
        CAUSAL=causal,
        HAS_W=window is not None,
        KSTRIDE=kstride,
        VARLEN=cu is not None,
        DOT_PREC=dot_precision(q.dtype),
    )
    scalars = (Tq, Tk, Tk - Tq if qoff is None else qoff, window or 0, koff, scale * LOG2E, scale, nrows)
    cq, ckv = cfg["q"], cfg["kv"]
    # dQ's longest programs are its last query blocks (launched first, as in the forward); dK/dV's
    # are its first key blocks, which the plain order already launches first
    o_q, o_k = launch_order(causal, window, cu is not None), 0
    tuned = _dkdv_tuned is not None and cu is None and q.dtype != torch.float32 and max(D, DV) <= 128
    qo = Tk - Tq if qoff is None else qoff
    recipe = recipe or default_recipe(window, cu, kstride, koff, qo)
    if recipe.dq == "ds" and not ds_applies(window, cu, kstride, koff, qo):
        raise ValueError("dQ from dS (recipe dq='ds') needs no window, no cu_seqlens and plain key positions")
    group = ds_group_heads(recipe, B, HQ, HKV, Tq, Tk, q)
    if group:
        _bwd_ds(q, k, v, du, lse, delta, dq, dk, dv, dummy, scalars, common, cfg, tuned, group, o_q)
        return dq, dk, dv, dg
    if cu is None:
        cu_q = cu_k = blk_q = blk_k = dummy
        grid_q, grid_k = (triton.cdiv(Tq, cq["BM"]), B * HQ), (triton.cdiv(Tk, ckv["BN"]), B * HKV)
    else:
        cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device=q.device) for c in cu)
        blk_q, nq = varlen_blocks(cu[0], cq["BM"], q.device)
        blk_k, nk = varlen_blocks(cu[1], ckv["BN"], q.device)
        grid_q, grid_k = (max(nq, 1), HQ), (max(nk, 1), HKV)
    kv_args = (q, k, v, du, lse, delta, dk, dv, dummy, cu_q, cu_k, blk_k, *scalars, 0)
    q_args = (q, k, v, du, lse, delta, dq, cu_q, cu_k, blk_q, *scalars)
    if tuned:  # cu is None here: the autotuned kernels take fixed-length batches only
        _dkdv_tuned[lambda m: (triton.cdiv(Tk, m["BN"]), B * HKV)](
            *kv_args, ORDER=o_k, STORE_DS=False, **common
        )
        _dq_tuned[lambda m: (triton.cdiv(Tq, m["BM"]), B * HQ)](*q_args, ORDER=o_q, **common)
        return dq, dk, dv, dg
    _bwd_dkdv_kernel[grid_k](*kv_args, ORDER=o_k, STORE_DS=False, **ckv, **common)
    _bwd_dq_kernel[grid_q](*q_args, ORDER=o_q, **cq, **common)
    return dq, dk, dv, dg
