"""KDA's gated intra-chunk gradients, after the shared per-chunk kernels of `grad`.

Those leave (per chunk and value head) dq, dk, db for every term that touches the state, dv, dβ
parts, and the scratch matrices dAqk = dO U'ᵀ (r ≥ i) and dA = −Y U'ᵀ (r > i). With b the
per-channel cumulative log decay, this kernel adds the terms of the gated scores
Aqk[r, i] = s Σ_c q_rc k_ic e^{b_rc − b_ic} and Akk[r, i] = β_r Σ_c k_rc k_ic e^{b_rc − b_ic}:

    dq_r += s Σ_{i≤r} dAqk_ri k_i e^{b_r − b_i}            Z_r = Σ_{i<r} dA_ri k_i e^{b_r − b_i}
    dk_i += s Σ_{r≥i} dAqk_ri q_r e^{b_r − b_i} + Σ_{r>i} β_r dA_ri k_r e^{b_r − b_i} + β_i Z_i
    db   += q ⊙ (intra dq) − k ⊙ (the two column sums above) + k ⊙ β Z,   dβ += Σ_c k ⊙ Z

then dg = reverse cumulative sum of db inside the chunk. Each channel is independent, so programs
tile K. The gated products use the 16-token sub-chunks and reference points of `kda_prep`: off
the diagonal every exponent stays ≤ 0, and a diagonal block is a dot through its sub-chunk's start
when the sub-chunk's decay is at most SPAN (elementwise with exponents ≤ 0 otherwise).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.delta.helpers import chunk_head, helper, load_vec16, mm, rcumsum, rsum
from lt2dsl.kernels.delta.kda_prep import sub_chunks


@helper
def load_m(
    M, t0, eos, i_hv,
    I: tl.constexpr, J: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr, TRANSPOSED: tl.constexpr,
):  # fmt: skip
    """Block (I, J) of a chunk's `[BT, BT]` scratch matrix as `[16, 16]` (or its transpose)."""
    o = tl.arange(0, 16)
    rows = t0 + I * 16 + o
    base = M + i_hv * BT + J * 16
    if TRANSPOSED:
        x = tl.load(
            base + rows.to(tl.int64)[None, :] * (HV * BT) + o[:, None], mask=(rows < eos)[None, :], other=0.0
        )
    else:
        x = tl.load(
            base + rows.to(tl.int64)[:, None] * (HV * BT) + o[None, :], mask=(rows < eos)[:, None], other=0.0
        )
    return x


@helper
def brow(pb, row, eos, ok, m_k, b_last, GS: tl.constexpr):
    """b of one token `[BK]`; tokens past eos hold the chunk's last b (no exponent turns positive)."""
    inside = (ok * 0 + row) < eos  # a vector mask: the interpreter rejects a 0-d one
    x = tl.load(pb + row.to(tl.int64) * GS + ok, mask=m_k & inside, other=0.0)
    return tl.where(inside, x, b_last)


@helper
def grad_column(
    bI, beI, pq, pk, pb, pMA, pMB, t0, I: tl.constexpr, j, eos, b_last, ok, m_k, o, rows, m_r,
    KS: tl.constexpr, GS: tl.constexpr, MS: tl.constexpr, dq, z, dka, dkb,
):  # fmt: skip
    """Step j of `diag_grads` for sub-chunk I: token j's rows of q, k, b and column / row j of the
    block (I, I) of the scratch matrices, added into the four `[16, BK]` accumulators. `o`, the
    sub-chunk's rows and their mask come from the caller, computed once outside the loop."""
    row = t0 + I * 16 + j
    inside = (ok * 0 + row) < eos
    k_j = tl.load(pk + row.to(tl.int64) * KS + ok, mask=m_k & inside, other=0.0).to(tl.float32)
    q_j = tl.load(pq + row.to(tl.int64) * KS + ok, mask=m_k & inside, other=0.0).to(tl.float32)
    b_j = brow(pb, row, eos, ok, m_k, b_last, GS)
    beta_j = rsum(tl.where(o == j, beI, 0.0), 0)
    ma_c = tl.load(pMA + rows.to(tl.int64) * MS + I * 16 + j, mask=m_r, other=0.0)
    mb_c = tl.load(pMB + rows.to(tl.int64) * MS + I * 16 + j, mask=m_r, other=0.0)
    in_j = (o * 0 + row) < eos
    ma_r = tl.load(pMA + row.to(tl.int64) * MS + I * 16 + o, mask=in_j, other=0.0)
    mb_r = tl.load(pMB + row.to(tl.int64) * MS + I * 16 + o, mask=in_j, other=0.0)
    k_er = k_j[None, :] * tl.exp(tl.where(o[:, None] >= j, bI - b_j[None, :], 0.0))
    e_c = tl.exp(tl.where(o[:, None] <= j, b_j[None, :] - bI, 0.0))
    dq += ma_c[:, None] * k_er
    z += mb_c[:, None] * k_er
    dka += ma_r[:, None] * (q_j[None, :] * e_c)
    dkb += (mb_r * beta_j)[:, None] * (k_j[None, :] * e_c)
    return dq, z, dka, dkb


@helper
def diag_grads(
    qI, kI, bI, beI, pq, pk, pb, pMA, pMB, t0, I: tl.constexpr, eos, b_last, ok, m_k,
    KS: tl.constexpr, GS: tl.constexpr, MS: tl.constexpr,
):  # fmt: skip
    """Intra-sub-chunk parts of (dq / s, Z, dk from Aqk / s, dk from Akk) of sub-chunk I, `[16, BK]`.

    Step j takes token j's rows of q, k, b from memory and column / row j of the block (I, I) of
    the scratch matrices; row forms (dq, Z) pair query rows r ≥ j with key j, column forms (dk)
    key rows i ≤ j with query j. Exponents on the other side are masked to 0 (their scratch
    entries are zero). No row or column is extracted from a register tile (a cross-thread
    reduction per step: the first version of this kernel cost 4x the peer's whole KDA backward).
    """
    o = tl.arange(0, 16)
    rows = t0 + I * 16 + o
    m_r = rows < eos
    dq = tl.zeros(qI.shape, dtype=tl.float32)
    z = tl.zeros(qI.shape, dtype=tl.float32)
    dka = tl.zeros(qI.shape, dtype=tl.float32)
    dkb = tl.zeros(qI.shape, dtype=tl.float32)
    for j in range(16):
        dq, z, dka, dkb = grad_column(
            bI, beI, pq, pk, pb, pMA, pMB, t0, I, j, eos, b_last, ok, m_k, o, rows, m_r, KS, GS, MS,
            dq, z, dka, dkb,
        )  # fmt: skip
    return dq, z, dka, dkb


@helper
def off_grads(MA, MB, MAt, MBt, qI, kI, bI, betaI, ref, kJ, bJ, DOT: tl.constexpr):
    """Contributions of block (I, J), I ≥ J, to (dq_I / s, Z_I, dk_J from Aqk / s, dk_J from Akk).

    `ref` is the cumulative decay at the token before sub-chunk I: e^{b_I − ref} ≤ 1, and for
    I > J also e^{ref − b_J} ≤ 1 (I = J: see `diag_pair`). MAt, MBt are the blocks loaded
    transposed (no dot result is transposed).
    """
    eI = tl.exp(bI - ref[None, :])
    eJ = tl.exp(ref[None, :] - bJ)
    kJs = kJ * eJ
    dq = eI * mm(MA, kJs, DOT)
    z = eI * mm(MB, kJs, DOT)
    dka = eJ * mm(MAt, qI * eI, DOT)
    dkb = eJ * mm(MBt * betaI[None, :], kI * eI, DOT)
    return dq, z, dka, dkb


@helper
def off_pair(
    MA, MB, t0, eos, i_hv, I: tl.constexpr, J: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr,
    qI, kI, bI, beI, ref, kJ, bJ, DOT: tl.constexpr,
):  # fmt: skip
    """`off_grads` of block (I, J) with its scratch blocks loaded (straight and transposed)."""
    return off_grads(
        load_m(MA, t0, eos, i_hv, I, J, HV, BT, False), load_m(MB, t0, eos, i_hv, I, J, HV, BT, False),
        load_m(MA, t0, eos, i_hv, I, J, HV, BT, True), load_m(MB, t0, eos, i_hv, I, J, HV, BT, True),
        qI, kI, bI, beI, ref, kJ, bJ, DOT,
    )  # fmt: skip


@helper
def add_off_pair(
    dqI, zI, dkaJ, dkbJ, MA, MB, t0, eos, i_hv, I: tl.constexpr, J: tl.constexpr, HV: tl.constexpr,
    BT: tl.constexpr, qI, kI, bI, beI, ref, kJ, bJ, DOT: tl.constexpr,
):  # fmt: skip
    """Block (I, J)'s `off_pair` added to sub-chunk I's (dq / s, Z) and sub-chunk J's (dk from Aqk / s,
    dk from Akk)."""
    xq, xz, xa, xb = off_pair(MA, MB, t0, eos, i_hv, I, J, HV, BT, qI, kI, bI, beI, ref, kJ, bJ, DOT)
    return dqI + xq, zI + xz, dkaJ + xa, dkbJ + xb


@helper
def add_off_pairs2(
    dqI, zI, dkaA, dkbA, dkaB, dkbB, MA, MB, t0, eos, i_hv, I: tl.constexpr, JA: tl.constexpr,
    JB: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr, qI, kI, bI, beI, ref, kA, bA, kB, bB,
    DOT: tl.constexpr,
):  # fmt: skip
    """`add_off_pair` of blocks (I, JA) then (I, JB): sub-chunk I's (dq / s, Z) and the dk parts of
    sub-chunks JA and JB."""
    dqI, zI, dkaA, dkbA = add_off_pair(dqI, zI, dkaA, dkbA, MA, MB, t0, eos, i_hv, I, JA, HV, BT,
                                       qI, kI, bI, beI, ref, kA, bA, DOT)  # fmt: skip
    dqI, zI, dkaB, dkbB = add_off_pair(dqI, zI, dkaB, dkbB, MA, MB, t0, eos, i_hv, I, JB, HV, BT,
                                       qI, kI, bI, beI, ref, kB, bB, DOT)  # fmt: skip
    return dqI, zI, dkaA, dkbA, dkaB, dkbB


@helper
def diag_pair(
    MA, MB, pq, pk, pb, pMA, pMB, t0, I: tl.constexpr, eos, i_hv, HV: tl.constexpr, BT: tl.constexpr,
    qI, kI, bI, beI, c, c_next, b_last, ok, m_k, KS: tl.constexpr, GS: tl.constexpr, MS: tl.constexpr,
    DOT: tl.constexpr, SPAN: tl.constexpr,
):  # fmt: skip
    """The diagonal block (I, I)'s parts of (dq / s, Z, dk from Aqk / s, dk from Akk).

    With c the decay before sub-chunk I and c_next after it: when max over channels of c − c_next
    is at most SPAN, the block is `off_grads` through the reference c, whose key-side factor
    e^{c − b} is then ≤ e^{SPAN} (the scratch blocks are zero above the diagonal, so no mask);
    stronger decays take the elementwise steps of `diag_grads`, every exponent ≤ 0.
    """
    if tl.max(c - c_next, axis=0) <= SPAN:
        dq, z, dka, dkb = off_pair(MA, MB, t0, eos, i_hv, I, I, HV, BT, qI, kI, bI, beI, c, kI, bI, DOT)
    else:
        dq, z, dka, dkb = diag_grads(qI, kI, bI, beI, pq, pk, pb, pMA, pMB, t0, I, eos, b_last, ok, m_k,
                                     KS, GS, MS)  # fmt: skip
    return dq, z, dka, dkb


@helper
def finish16(
    pdq, pdk, pdg, pdb, qI, kI, beI, dqI, zI, dkaI, dkbI, carry, scale, t0, I: tl.constexpr, eos,
    S: tl.constexpr, HV: tl.constexpr, ok, m_k,
):  # fmt: skip
    """Add sub-chunk I's terms into dq, dk (`[rows, S]` at channels ok), write its dg (reverse
    cumulative sum of db plus `carry`) and its dβ part; returns the carry for sub-chunk I − 1."""
    rows = t0 + I * 16 + tl.arange(0, 16)
    m_r = rows < eos
    p = rows.to(tl.int64)[:, None] * S + ok[None, :]
    m = m_r[:, None] & m_k[None, :]
    dq_i = dqI * scale
    dk_i = dkaI * scale + dkbI
    bz = beI[:, None] * zI
    tl.store(pdq + p, tl.load(pdq + p, mask=m, other=0.0) + dq_i, mask=m)
    tl.store(pdk + p, tl.load(pdk + p, mask=m, other=0.0) + dk_i + bz, mask=m)
    db = tl.load(pdg + p, mask=m, other=0.0) + qI * dq_i - kI * dk_i + kI * bz
    total = rsum(db, 0)
    tl.store(pdg + p, (carry + total)[None, :] - rcumsum(db, 0) + db, mask=m)
    carry += total
    # dβ gets Σ_c k ⊙ Z of this channel slice; the slices are summed on the host.
    tl.store(pdb + rows.to(tl.int64) * HV, rsum(kI * zI, 1), mask=m_r)
    return carry


@triton.jit
def kda_grad_intra_kernel(
    q, k, gcum, beta, MA, MB, dq, dk, dg, dbeta_intra, cu_seqlens, chunk_indices, T, R, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT: tl.constexpr, SPAN: tl.constexpr,
):  # fmt: skip
    i_k, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hv, i_h, i_t, bos, eos, _ = chunk_head(i_c, i_bh, cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    t0 = bos + i_t * BT
    ok = i_k * BK + tl.arange(0, BK)
    m_k = ok < K
    pq, pk, pb = q + i_h * K, k + i_h * K, gcum + i_hv * K
    pMA, pMB = MA + i_hv * BT, MB + i_hv * BT
    last = tl.minimum(t0 + BT, eos) - 1
    b_last = tl.load(pb + last.to(tl.int64) * HV * K + ok, mask=m_k, other=0.0)
    o = tl.arange(0, 16)
    # Per sub-chunk tiles; padded rows hold the chunk's last decay, so no exponent turns positive.
    q0, q1, q2, q3 = sub_chunks(pq, t0, eos, H * K, ok, m_k)
    k0, k1, k2, k3 = sub_chunks(pk, t0, eos, H * K, ok, m_k)
    b0, b1, b2, b3 = sub_chunks(pb, t0, eos, HV * K, ok, m_k)
    b0 = tl.where((t0 + o < eos)[:, None], b0, b_last[None, :])
    b1 = tl.where((t0 + 16 + o < eos)[:, None], b1, b_last[None, :])
    b2 = tl.where((t0 + 32 + o < eos)[:, None], b2, b_last[None, :])
    b3 = tl.where((t0 + 48 + o < eos)[:, None], b3, b_last[None, :])
    be0 = load_vec16(beta + i_hv, t0, 0, eos, HV)
    be1 = load_vec16(beta + i_hv, t0, 1, eos, HV)
    be2 = load_vec16(beta + i_hv, t0, 2, eos, HV)
    be3 = load_vec16(beta + i_hv, t0, 3, eos, HV)
    # reference points: b at the token before sub-chunks 1, 2, 3
    c1 = brow(pb, t0 + 15, eos, ok, m_k, b_last, HV * K)
    c2 = brow(pb, t0 + 31, eos, ok, m_k, b_last, HV * K)
    c3 = brow(pb, t0 + 47, eos, ok, m_k, b_last, HV * K)

    MS: tl.constexpr = HV * BT
    c0 = tl.zeros([BK], dtype=tl.float32)
    dq0, z0, dka0, dkb0 = diag_pair(MA, MB, pq, pk, pb, pMA, pMB, t0, 0, eos, i_hv, HV, BT, q0, k0, b0, be0,
                                    c0, c1, b_last, ok, m_k, H * K, HV * K, MS, DOT, SPAN)  # fmt: skip
    dq1, z1, dka1, dkb1 = diag_pair(MA, MB, pq, pk, pb, pMA, pMB, t0, 1, eos, i_hv, HV, BT, q1, k1, b1, be1,
                                    c1, c2, b_last, ok, m_k, H * K, HV * K, MS, DOT, SPAN)  # fmt: skip
    dq2, z2, dka2, dkb2 = diag_pair(MA, MB, pq, pk, pb, pMA, pMB, t0, 2, eos, i_hv, HV, BT, q2, k2, b2, be2,
                                    c2, c3, b_last, ok, m_k, H * K, HV * K, MS, DOT, SPAN)  # fmt: skip
    dq3, z3, dka3, dkb3 = diag_pair(MA, MB, pq, pk, pb, pMA, pMB, t0, 3, eos, i_hv, HV, BT, q3, k3, b3, be3,
                                    c3, b_last, b_last, ok, m_k, H * K, HV * K, MS, DOT,
                                    SPAN)  # fmt: skip

    dq1, z1, dka0, dkb0 = add_off_pair(dq1, z1, dka0, dkb0, MA, MB, t0, eos, i_hv, 1, 0, HV, BT,
                                       q1, k1, b1, be1, c1, k0, b0, DOT)  # fmt: skip
    dq2, z2, dka0, dkb0, dka1, dkb1 = add_off_pairs2(dq2, z2, dka0, dkb0, dka1, dkb1, MA, MB, t0, eos, i_hv,
                                                     2, 0, 1, HV, BT, q2, k2, b2, be2, c2, k0, b0, k1, b1,
                                                     DOT)  # fmt: skip
    dq3, z3, dka0, dkb0, dka1, dkb1 = add_off_pairs2(dq3, z3, dka0, dkb0, dka1, dkb1, MA, MB, t0, eos, i_hv,
                                                     3, 0, 1, HV, BT, q3, k3, b3, be3, c3, k0, b0, k1, b1,
                                                     DOT)  # fmt: skip
    dq3, z3, dka2, dkb2 = add_off_pair(dq3, z3, dka2, dkb2, MA, MB, t0, eos, i_hv, 3, 2, HV, BT,
                                       q3, k3, b3, be3, c3, k2, b2, DOT)  # fmt: skip

    # Write dq, dk, and dg = the reverse cumulative sum of db over the chunk, last sub-chunk first
    # (`carry`: Σ db of the sub-chunks after the current one).
    pdq, pdk, pdg = dq + i_hv * K, dk + i_hv * K, dg + i_hv * K
    pdb = dbeta_intra + i_k.to(tl.int64) * R * HV + i_hv
    S: tl.constexpr = HV * K
    carry = tl.zeros([BK], dtype=tl.float32)
    carry = finish16(pdq, pdk, pdg, pdb, q3, k3, be3, dq3, z3, dka3, dkb3, carry, scale, t0, 3, eos,
                     S, HV, ok, m_k)  # fmt: skip
    carry = finish16(pdq, pdk, pdg, pdb, q2, k2, be2, dq2, z2, dka2, dkb2, carry, scale, t0, 2, eos,
                     S, HV, ok, m_k)  # fmt: skip
    carry = finish16(pdq, pdk, pdg, pdb, q1, k1, be1, dq1, z1, dka1, dkb1, carry, scale, t0, 1, eos,
                     S, HV, ok, m_k)  # fmt: skip
    carry = finish16(pdq, pdk, pdg, pdb, q0, k0, be0, dq0, z0, dka0, dkb0, carry, scale, t0, 0, eos,
                     S, HV, ok, m_k)  # fmt: skip
