"""Shared tile helpers of the delta-rule scans, and the reverse (gradient) state scan.

The forward scan and output are in `delta_split`. The reverse kernel carries dS (gradient of the
state after the chunk) from the last chunk back, one program per (V tile, sequence x value head),
dS `[K, BV]` in fp32 registers (mixers.md §4–§6, b = chunk-local cumulative log decay, γ = e^b,
GATE 0 none / 1 scalar per token / 2 per key channel; DeltaNet runs as GATE 1 with b = 0):

    dU' = Pᵀ dO + (K ⊙ e^{b_C − b}) dS,   Y = Tᵀ dU'                 (stored: dh = dS, Y)
    dS ← Diag(γ_C) dS + (sQ ⊙ γ)ᵀ dO − (K ⊙ γ)ᵀ Diag(β) Y

P is read from `Aqk` (`delta_wy.delta_qk_fwd_kernel`, or KDA's intra-chunk kernel).

Hopper: both gate kinds run one code shape, that of KDA's scan, which ran correctly on the H200.
An earlier scalar-gate forward (P formed in the scan as s Q Kᵀ, K and Q fed raw to K·S, Q·S and
Kᵀ·U') hit an illegal memory access from the second chunk on under Triton 3.6 (BENCHMARKS.md).
Here every dot operand is a tile from memory or derived elementwise in fp32 (K ⊙ γ, sQ ⊙ γ), no raw
q/k tile is transposed, and the key tile is at least 32 rows (`delta_launch.state_bk`).

Precision: with 16-bit inputs, the dots on computed fp32 tiles (Tᵀ·dU', Pᵀ·dO, Qᵀ·dO, Kᵀ·Y) run in
TF32 (`mm_xx` in `delta_tl`); K·dS takes dS and the scaled keys rounded to the input dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.tl_util import NO_CACHE_MODIFIER, cast
from lt2dsl.kernels.delta.helpers import helper, mm, mm_xx, seq_coords


@helper
def load_tile(
    base,
    r0,
    n_rows,
    STRIDE: tl.constexpr,
    c0,
    D: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
    CACHE: tl.constexpr = NO_CACHE_MODIFIER,
):
    """`[BR, BC]` tile at rows r0.., columns c0.. of a `[rows, STRIDE]` buffer starting at `base`.

    Rows ≥ n_rows and columns ≥ D read 0. Offsets are int32 relative to the (int64) scalar base;
    when D is a multiple of BC only the rows are masked, which keeps the loads vectorised. CACHE is
    the load's cache modifier (`tl_util.NO_CACHE_MODIFIER`: none).
    """
    orow = r0 + tl.arange(0, BR)
    ocol = c0 + tl.arange(0, BC)
    p = base + orow[:, None] * STRIDE + ocol[None, :]
    if D % BC == 0:
        x = tl.load(p, mask=(orow < n_rows)[:, None], other=0.0, cache_modifier=CACHE)
    else:
        x = tl.load(p, mask=(orow < n_rows)[:, None] & (ocol < D)[None, :], other=0.0, cache_modifier=CACHE)
    return x


@helper
def load_tile_apart(
    base, r0, n_rows, STRIDE: tl.constexpr, c0, D: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr
):
    """`load_tile` as a load of its own, for the elementwise use of a tile that also feeds `tl.dot`.

    A raw dot operand with a second, non-dot use gets one shared buffer from Triton's pipeliner at
    2 stages, refilled while asynchronous wgmma dots still read it (the ninth session's race,
    `bench/ttgir_checks.py`); CSE would merge an identical second load back into the first,
    so this one reads through L2 (".cg"), where the first load left the tile.
    """
    return load_tile(base, r0, n_rows, STRIDE, c0, D, BR, BC, ".cg")


@helper
def store_tile(
    base, x, r0, n_rows, STRIDE: tl.constexpr, c0, D: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr
):
    """Store `x` `[BR, BC]` where `load_tile` reads (same masks), cast to the buffer's dtype."""
    orow = r0 + tl.arange(0, BR)
    ocol = c0 + tl.arange(0, BC)
    p = base + orow[:, None] * STRIDE + ocol[None, :]
    if D % BC == 0:
        tl.store(p, cast(x, base.dtype.element_ty), mask=(orow < n_rows)[:, None])
    else:
        tl.store(p, cast(x, base.dtype.element_ty), mask=(orow < n_rows)[:, None] & (ocol < D)[None, :])


@helper
def load_tile_t(
    base, r0, n_rows, STRIDE: tl.constexpr, c0, D: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr
):
    """The `load_tile` tile transposed, `[BC, BR]`, read through transposed pointers (no tile is
    transposed in registers)."""
    orow = r0 + tl.arange(0, BR)
    ocol = c0 + tl.arange(0, BC)
    p = base + orow[None, :] * STRIDE + ocol[:, None]
    if D % BC == 0:
        x = tl.load(p, mask=(orow < n_rows)[None, :], other=0.0)
    else:
        x = tl.load(p, mask=(orow < n_rows)[None, :] & (ocol < D)[:, None], other=0.0)
    return x


@helper
def store_tile_t(
    base, x, r0, n_rows, STRIDE: tl.constexpr, c0, D: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr
):
    """Store `x` `[BC, BR]` transposed where `load_tile` reads `[BR, BC]` (same masks)."""
    orow = r0 + tl.arange(0, BR)
    ocol = c0 + tl.arange(0, BC)
    p = base + orow[None, :] * STRIDE + ocol[:, None]
    if D % BC == 0:
        tl.store(p, cast(x, base.dtype.element_ty), mask=(orow < n_rows)[None, :])
    else:
        tl.store(p, cast(x, base.dtype.element_ty), mask=(orow < n_rows)[None, :] & (ocol < D)[:, None])


@helper
def load_chunk_gate(
    gcum,
    t0,
    eos,
    i_hv,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    GATE: tl.constexpr,
):
    """(b `[BT]` or `[BT, BK]`, b_last `[1]` or `[BK]`) of one chunk; rows past eos hold b_last.

    Holding b_last on padded rows keeps every e^{b_r − b_i} with r ≥ i at most 1 there too.
    """
    ot = tl.arange(0, BT)
    rows = t0 + ot
    m_t = rows < eos
    last = tl.minimum(t0 + BT, eos) - 1
    if GATE == 1:
        b_last = tl.load(gcum + last.to(tl.int64) * HV + i_hv + tl.zeros([1], dtype=tl.int32))
        b = tl.load(gcum + rows.to(tl.int64) * HV + i_hv, mask=m_t, other=0.0)
        b = tl.where(m_t, b, b_last)
    else:
        ok = tl.arange(0, BK)
        b_last = tl.load(gcum + (last.to(tl.int64) * HV + i_hv) * K + ok, mask=ok < K, other=0.0)
        p = gcum + (rows.to(tl.int64)[:, None] * HV + i_hv) * K + ok[None, :]
        b = tl.load(p, mask=m_t[:, None] & (ok < K)[None, :], other=0.0)
        b = tl.where(m_t[:, None], b, b_last[None, :])
    return b, b_last


@helper
def gate_factors(b, b_last, GATE: tl.constexpr):
    """(γ, e^{b_C − b}, γ_C): `[BT]`, `[BT]`, `[1]` for a scalar gate; `[BT, BK]`, `[BT, BK]`, `[BK, 1]`
    for a per-channel one. Scalar factors scale dot results or `[BT, BV]` operands (no scaled
    copy of K is formed); per-channel ones must scale K itself."""
    if GATE == 1:
        gam = tl.exp(b)
        to_end = tl.exp(b_last - b)
        gam_c = tl.exp(b_last)[:, None]  # [1, 1]
    else:
        gam = tl.exp(b)
        to_end = tl.exp(b_last[None, :] - b)
        gam_c = tl.exp(b_last)[:, None]  # [BK, 1]
    return gam, to_end, gam_c


@helper
def load_square(ptr, t0, eos, i_hv, HV: tl.constexpr, BT: tl.constexpr, TRANSPOSED: tl.constexpr):
    """The chunk's `[BT, BT]` fp32 matrix from a `[B*T, HV, BT]` buffer (or its transpose)."""
    ot = tl.arange(0, BT)
    base = ptr + (t0.to(tl.int64) * HV + i_hv) * BT
    x = tl.load(base + ot[:, None] * (HV * BT) + ot[None, :], mask=(t0 + ot < eos)[:, None], other=0.0)
    if TRANSPOSED:
        x = tl.trans(x)
    return x


@triton.jit
def delta_state_bwd_kernel(
    q,
    k,
    gcum,
    beta,
    Ainv,
    Aqk,
    do,
    dht,
    dh,
    Y,
    dh0,
    cu_seqlens,
    chunk_offsets,
    T,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    USE_DHT: tl.constexpr,
    STORE_DH0: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, eos, NT, boh = seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    DT = q.dtype.element_ty
    L = eos - bos
    b64 = bos.to(tl.int64)
    qk_base = (b64 * H + i_h) * K
    v_base = (b64 * HV + i_hv) * V
    s_base = i_nh.to(tl.int64) * K * V

    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dS += load_tile(dht + s_base, 0, K, V, i_v * BV, V, BK, BV).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        r0 = i_t * BT
        p_h = dh + ((boh + i_t).to(tl.int64) * HV + i_hv) * K * V
        store_tile(p_h, dS, 0, K, V, i_v * BV, V, BK, BV)
        b_k = load_tile(k + qk_base, r0, L, H * K, 0, K, BT, BK)
        b_q = load_tile(q + qk_base, r0, L, H * K, 0, K, BT, BK)
        b_do = load_tile(do + v_base, r0, L, HV * V, i_v * BV, V, BT, BV)
        b_dof = b_do.to(tl.float32)
        b_beta = tl.load(
            beta + (bos + r0 + tl.arange(0, BT)).to(tl.int64) * HV + i_hv,
            mask=r0 + tl.arange(0, BT) < L,
            other=0.0,
        ).to(tl.float32)
        b_g, b_glast = load_chunk_gate(gcum, bos + r0, eos, i_hv, HV, K, BT, BK, GATE)
        gam, to_end, gam_c = gate_factors(b_g, b_glast, GATE)
        if GATE == 1:
            gam, to_end = gam[:, None], to_end[:, None]
        b_Pt = load_square(Aqk, bos + r0, eos, i_hv, HV, BT, True)
        kds = mm((b_k.to(tl.float32) * to_end).to(DT), dS.to(DT), DOT)
        # dU' = Pᵀ dO + (K ⊙ e^{b_C − b}) dS', then Y = Tᵀ dU'.
        du = mm_xx(b_Pt, b_dof, DT, PREC, DOT) + kds
        b_Tt = load_square(Ainv, bos + r0, eos, i_hv, HV, BT, True)
        b_y = mm_xx(b_Tt, du, DT, PREC, DOT)
        store_tile(Y + v_base, b_y, r0, L, HV * V, i_v * BV, V, BT, BV)
        # dS ← Diag(γ_C) dS' + (sQ ⊙ γ)ᵀ dO − (K ⊙ γ)ᵀ Diag(β) Y
        dS = dS * gam_c + mm_xx(tl.trans(b_q.to(tl.float32) * (gam * scale)), b_dof, DT, PREC, DOT)
        dS -= mm_xx(tl.trans(b_k.to(tl.float32) * gam), b_y * b_beta[:, None], DT, PREC, DOT)
    if STORE_DH0:
        store_tile(dh0 + s_base, dS, 0, K, V, i_v * BV, V, BK, BV)
