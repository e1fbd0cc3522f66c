"""Triton kernel of a whole GDN block's decode step in one persistent launch.

A decode step of the looped hybrid is ~1,200 launches, each of which drains the memory system
before the next one fills it (docs/decode.md, "Status"): one launch per block replaces eleven
(a GDN block of `examples/lt2_hybrid_gdn_dsa.lt2`: in-projection, convs, recurrence, gated norm,
o_proj, add-norm, gate/up, SwiGLU, down). For M ≤ 16 rows, one token each, six phases with a grid
barrier between them, every program taking the phase's work items p, p + P, …:

1. `y1 = xn @ W_in^T` (the concatenated q, k, v, z, a, b projections), tiles of BN outputs;
2. the GDN recurrence with the convs inside (`delta.gdn_step.recurrent_item`), items (V tile,
   row · value head): the fp32 state and the v history updated in place;
3. the gated output norm and the q/k histories' shift (`delta.gdn_step.norm_item`), items
   row · value head;
4. `h2 = res + on @ W_o^T` (written: the residual stream after the mixer);
5. `act = swiglu(rmsnorm(h2) · γ₂ @ W_gu^T)`: each program forms every row's rstd from h2 first
   (M × D values from L2), then the gate and up tiles of its outputs;
6. `y = act @ W_down^T`.

The block's last residual add and the next block's norm stay outside (`fused.add_rmsnorm`).
Rounding points are the unfused chain's: each product's output in the dtype, h2 = (res + proj)
rounded, the norm's output rounded before the product, SwiGLU rounded once, the GDN step's own.

`PHASE` 1-6 runs that phase alone (grid = its items): what the CPU interpreter runs (its programs
run one after another, so a grid barrier would wait forever) and the reference of the barrier
form. `PHASE` 0 runs all six in one launch of P programs through five grid barriers
(`common.grid_sync`), which must all be resident at once (P ≤ the card's SMs, one program an SM, a
cooperative launch).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.grid_sync import barrier_base, grid_barrier
from lt2dsl.kernels.common.tl_util import cast, helper
from lt2dsl.kernels.delta.gdn_step import norm_item, recurrent_item
from lt2dsl.kernels.gemv.triton_gemv import _dot

BARRIERS = tl.constexpr(5)  # grid barriers a persistent launch passes (between its six phases)
CG = tl.constexpr(".cg")


@helper
def _rstd(x, sx, M, K, eps, BM: tl.constexpr, BK: tl.constexpr):
    """1 / sqrt(mean(x²) + eps) of each of the M rows of x `[M, K]` (fp32 `[BM]`)."""
    rm = tl.arange(0, BM)
    ss = tl.zeros([BM], dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        m = (rk < K)[:, None] & (rm < M)[None, :]
        b_x = tl.load(x + rm[None, :] * sx + rk[:, None], mask=m, other=0.0, cache_modifier=CG).to(tl.float32)
        ss += tl.sum(b_x * b_x, axis=0)
    return 1.0 / tl.sqrt(ss / K + eps)


@helper
def _x_tile(x, sx, g, rstd, rk, m_k, m_m, NORM: tl.constexpr, BM: tl.constexpr, DT: tl.constexpr):
    """The `[BK, BM]` input tile at rows rk: x, or x · rstd · γ rounded to the dtype with NORM."""
    rm = tl.arange(0, BM)
    b_x = tl.load(
        x + rm[None, :] * sx + rk[:, None], mask=m_k[:, None] & m_m[None, :], other=0.0, cache_modifier=CG
    )
    if NORM:
        b_g = tl.load(g + rk, mask=m_k, other=0.0).to(tl.float32)
        b_x = cast(b_x.to(tl.float32) * rstd[None, :] * b_g[:, None], DT)
    return b_x


@helper
def _k_step(acc, acc_u, x, sx, w, g, rstd, up, rn, m_n, rk, K, m_m, NORM: tl.constexpr, EPI: tl.constexpr,
            BM: tl.constexpr, DT: tl.constexpr):  # fmt: skip
    """One K tile rk of the tile of outputs rn: (acc, acc_u) plus W's gate (and, for SwiGLU, up)
    rows times the input tile."""
    m_k = rk < K
    b_x = _x_tile(x, sx, g, rstd, rk, m_k, m_m, NORM, BM, DT)
    m_w = m_n[:, None] & m_k[None, :]
    acc += _dot(tl.load(w + rn[:, None] * K + rk[None, :], mask=m_w, other=0.0), b_x)
    if EPI == 1:
        acc_u += _dot(tl.load(w + (rn[:, None] + up) * K + rk[None, :], mask=m_w, other=0.0), b_x)
    return acc, acc_u


@helper
def _store_tile(
    acc, acc_u, y, sy, r, sr, rn, m_n, m_m, EPI: tl.constexpr, BM: tl.constexpr, DT: tl.constexpr
):
    """The epilogue of one tile of outputs rn (`_product`'s EPI) and its store."""
    rm = tl.arange(0, BM)
    out = cast(acc, DT).to(tl.float32)
    m_y = m_n[:, None] & m_m[None, :]
    if EPI == 1:
        out = out * tl.sigmoid(out) * cast(acc_u, DT).to(tl.float32)
    if EPI == 2:
        out += tl.load(r + rm[None, :] * sr + rn[:, None], mask=m_y, other=0.0).to(tl.float32)
    tl.store(y + rm[None, :] * sy + rn[:, None], cast(out, DT), mask=m_y)


@helper
def _product(
    x, sx, w, y, sy, r, sr, g, rstd, up, M, N, K, pid, P,
    NORM: tl.constexpr, EPI: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    STAGES: tl.constexpr, FLAT: tl.constexpr,
):  # fmt: skip
    """y[:, n] = f(x) @ W[n, :K]ᵀ for the tiles n of BN outputs this program owns (p, p + P, …).

    NORM: f(x) = x · rstd · γ rounded to the dtype (the unfused norm's output), else x. EPI 0: y in
    the dtype; 1 SwiGLU: W's rows up + n are the up half, y = silu(g) · u rounded once from the
    rounded g and u; 2 residual: y = r + (the product rounded), rounded. FLAT: one loop over this
    program's (tile, K tile) pairs, so the load pipeline runs across tiles instead of draining at
    the end of each (a tile of the in-projection is only K / BK = 4-8 loads deep); the same
    sums in the same order. STAGES: the K loop's load pipeline depth.
    """
    DT = y.dtype.element_ty
    m_m = tl.arange(0, BM) < M
    if FLAT:
        n_k = tl.cdiv(K, BK)
        mine = (tl.cdiv(N, BN) - pid + P - 1) // P
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        acc_u = tl.zeros([BN, BM], dtype=tl.float32)
        for it in tl.range(0, mine * n_k, num_stages=STAGES):
            t = pid + (it // n_k) * P
            rn = tl.arange(0, BN).to(tl.int64) + t * BN
            m_n = rn < N
            rk = (it % n_k) * BK + tl.arange(0, BK)
            acc, acc_u = _k_step(acc, acc_u, x, sx, w, g, rstd, up, rn, m_n, rk, K, m_m, NORM, EPI, BM, DT)
            if it % n_k == n_k - 1:
                _store_tile(acc, acc_u, y, sy, r, sr, rn, m_n, m_m, EPI, BM, DT)
                acc = tl.zeros([BN, BM], dtype=tl.float32)
                acc_u = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        for t in range(pid, tl.cdiv(N, BN), P):
            rn = tl.arange(0, BN).to(tl.int64) + t * BN
            m_n = rn < N
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            acc_u = tl.zeros([BN, BM], dtype=tl.float32)
            for k0 in tl.range(0, K, BK, num_stages=STAGES):
                rk = k0 + tl.arange(0, BK)
                acc, acc_u = _k_step(
                    acc, acc_u, x, sx, w, g, rstd, up, rn, m_n, rk, K, m_m, NORM, EPI, BM, DT
                )
            _store_tile(acc, acc_u, y, sy, r, sr, rn, m_n, m_m, EPI, BM, DT)


@triton.jit
def gdn_block_kernel(
    XN, RES, WIN, Y1, HQ, HK, HVH, WQ, WK, WV, BQ, BK_, BV_, A_log, dt_bias, S, O, GO, ON, WO, H2, G2,
    WGU, ACT, WD, Y, BAR,
    M, D, NIN, HID, sxn, sres, q_off, k_off, v_off, z_off, a_off, b_off,
    shq, shk, shv, shqc, shkc, shvc, scale, beta_scale, eps_o, eps2,
    PHASE: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BKH: tl.constexpr, BV: tl.constexpr, BVF: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
    HAS_BQ: tl.constexpr, HAS_BK: tl.constexpr, HAS_BV: tl.constexpr,
    BM: tl.constexpr, BNW: tl.constexpr, BKW: tl.constexpr, SW: tl.constexpr, BNN: tl.constexpr,
    BKN: tl.constexpr, SN: tl.constexpr, FLAT: tl.constexpr,
):  # fmt: skip
    """The module docstring's phases (PHASE 0: all, through grid barriers; 1-6: that one).

    XN, RES `[M, D]` rows sxn, sres apart; WIN `[NIN, D]`; Y1 `[M, NIN]` (q, k, v, z, a, b at
    their column offsets); H* `[M, C, W−1]` conv histories; W* `[C, W]`; S `[M, HV, K, V]` fp32;
    O, ON `[M, HV·V]`; GO `[V]`; WO `[D, HV·V]`; H2, Y `[M, D]`; G2 `[D]`; WGU `[2·HID, D]`
    (gate rows, then up); ACT `[M, HID]`; WD `[D, HID]`; BAR one int64. The wide products (1, 5)
    take tiles of BNW × BKW through SW stages, the narrow ones (4, 6: D outputs) BNN × BKN, SN.
    """
    pid, P = tl.program_id(0), tl.num_programs(0)
    ALL: tl.constexpr = PHASE == 0
    base = 0
    if ALL:
        base = barrier_base(BAR, BARRIERS * P)
    if ALL or PHASE == 1:
        _product(
            XN, sxn, WIN, Y1, NIN, Y1, 0, WIN, 0.0, 0, M, NIN, D, pid, P, False, 0, BM, BNW, BKW, SW, FLAT
        )
    if ALL:
        grid_barrier(BAR, base + P)
    if ALL or PHASE == 2:
        NV: tl.constexpr = (V + BV - 1) // BV
        for it in range(pid, NV * M * HV, P):
            i = it + pid * 0  # a tensor under the interpreter too (the helpers call its methods)
            recurrent_item(
                i % NV, i // NV, Y1 + q_off, Y1 + k_off, Y1 + v_off, Y1 + a_off, Y1 + b_off, HQ, HK, HVH, WQ,
                WK, WV, BQ, BK_, BV_, A_log, dt_bias, S, O, NIN, NIN, NIN, NIN, shq, shk, shv, shqc, shkc,
                shvc, scale, beta_scale, H, HV, K, V, BKH, BV, W, WP, HAS_BQ, HAS_BK, HAS_BV,
            )  # fmt: skip
    if ALL:
        grid_barrier(BAR, base + 2 * P)
    if ALL or PHASE == 3:
        for it in range(pid, M * HV, P):
            i = it + pid * 0
            norm_item(
                i, O, Y1 + z_off, GO, ON, Y1 + q_off, Y1 + k_off, HQ, HK, NIN, NIN, NIN, shq, shk, shqc, shkc,
                eps_o, H, HV, K, V, BKH, BVF, W, WP,
            )  # fmt: skip
    if ALL:
        grid_barrier(BAR, base + 3 * P)
    if ALL or PHASE == 4:
        _product(
            ON,
            HV * V,
            WO,
            H2,
            D,
            RES,
            sres,
            WO,
            0.0,
            0,
            M,
            D,
            HV * V,
            pid,
            P,
            False,
            2,
            BM,
            BNN,
            BKN,
            SN,
            FLAT,
        )
    if ALL:
        grid_barrier(BAR, base + 4 * P)
    if ALL or PHASE == 5:
        rstd = _rstd(H2, D, M, D, eps2, BM, BKW)
        _product(
            H2, D, WGU, ACT, HID, H2, 0, G2, rstd, HID, M, HID, D, pid, P, True, 1, BM, BNW, BKW, SW, FLAT
        )
    if ALL:
        grid_barrier(BAR, base + 5 * P)
    if ALL or PHASE == 6:
        _product(ACT, HID, WD, Y, D, Y, 0, WD, 0.0, 0, M, D, HID, pid, P, False, 0, BM, BNN, BKN, SN, FLAT)
