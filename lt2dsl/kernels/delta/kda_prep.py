"""KDA chunk preparation: per-channel gate cumsum, T = (I + A)^{-1} and the gated scores Aqk.

With per-channel decay the intra-chunk products carry e^{b_rc − b_ic} inside the channel sum
(mixers.md §6 (b), (e)):

    Akk[r, i] = β_r Σ_c k_rc k_ic e^{b_rc − b_ic}   (r > i)
    Aqk[r, i] = s Σ_c q_rc k_ic e^{b_rc − b_ic}     (r ≥ i)

Splitting the factor as K ⊙ e^{−b} overflows once −b > 88, so each 64-chunk is cut into four
16-token sub-chunks:

* below the diagonal (query sub-chunk I after key sub-chunk J) the reference point is the
  cumulative decay at the last token before sub-chunk I, b* ≥ b_r (r ∈ I) and b* ≤ b_i (i ∈ J), so
  both factors (Q ⊙ e^{b − b*}) and (K ⊙ e^{b* − b}) are ≤ 1 and the block is one `tl.dot`;
* a diagonal 16 x 16 block goes through the same reference c (b before its sub-chunk) when the
  sub-chunk's decay is moderate, max over channels of c − b_last ≤ SPAN: the key factor
  K ⊙ e^{c − b} is then ≤ e^{SPAN} and the block is one `tl.dot`. Stronger decays take the
  elementwise form in fp32 with e^{b_r − b_i} ≤ 1 (r ≥ i), one column i at a time from row i of k
  and g loaded from memory (`diag16`). The test is one branch per sub-chunk and channel slice;
  ordinary gates take the dots.

The q and k rows of a sub-chunk scaled to its reference are formed once for its diagonal block and
the blocks left of it; the keys of a sub-chunk are kept referenced to its end and rescaled by a
per-channel vector for each later sub-chunk (`sub_chunk`).

Channels are walked in slices of BK (every quantity above is a sum over channels). One program per
(chunk, batch x value head) writes gcum `[B*T, HV, K]`, Ainv and Aqk `[B*T, HV, 64]` (fp32).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.delta.helpers import (
    chunk_head,
    helper,
    inv_unit_lower64,
    load_vec16,
    mm,
    rcumsum,
    rsum,
    stack4,
    store_lower64,
)


@helper
def scaled(x, b, ref):
    """x ⊙ e^{b − ref} (fp32): ≤ |x| when ref is a decay before b's rows."""
    return x * tl.exp(b - ref[None, :])


@helper
def keys_to(k, b, ref):
    """(K ⊙ e^{ref − b})ᵀ `[BK, 16]` (fp32): ≤ |K| when ref is a decay after b's rows."""
    return tl.trans(k * tl.exp(ref[None, :] - b))


@helper
def rescale(x, d):
    """x ⊙ e^{d} per channel (d ≤ 0 here), fp32."""
    return x.to(tl.float32) * tl.exp(d)[None, :]


@helper
def sub_chunk(
    pq, pk, pg, pgc, t0, I: tl.constexpr, eos, c, KS: tl.constexpr, GS: tl.constexpr, ok, m_k,
    DOT: tl.constexpr, SPAN: tl.constexpr, WANT_Q: tl.constexpr, WANT_K: tl.constexpr,
):  # fmt: skip
    """Sub-chunk I given c (the decay b before it): stores its gcum rows (with WANT_K) and returns
    its q and k rows scaled to c (xs, ks: ≤ |q|, |k|), its diagonal blocks for both (entries above
    the diagonal are junk, masked by the caller), its keys referenced to its end, K ⊙ e^{c' − b}
    (≤ |K|), and c' (b after it). The diagonal blocks are dots with K ⊙ e^{c − b} (≤ e^{SPAN}) when
    the sub-chunk's decay, max over channels of c − c', is at most SPAN; elementwise (`diag16`)
    otherwise. WANT_Q / WANT_K: which side (Aqk, Akk) the program forms; the other side's outputs
    are placeholders the caller does not use."""
    gI = rows16(pg, t0, I, eos, GS, ok, m_k)
    b = rcumsum(gI, 0) + c[None, :]
    if WANT_K:
        store_rows16(pgc, b, t0, I, eos, GS, ok, m_k)
    c_next = c + rsum(gI, 0)
    k = rows16(pk, t0, I, eos, KS, ok, m_k)
    ks = scaled(k, b, c)
    if WANT_Q:
        x = rows16(pq, t0, I, eos, KS, ok, m_k)
        xs = scaled(x, b, c)
    else:
        x = k
        xs = ks
    if tl.max(c - c_next, axis=0) <= SPAN:
        kd = keys_to(k, b, c)
        A = mm(xs, kd, DOT)
        Kk = A
    else:
        A, Kk = diag16(x, k, b, c, pk, pg, t0, I, eos, KS, GS, ok, m_k)
        if not WANT_Q:
            A = Kk
    ke = k * tl.exp(c_next[None, :] - b)
    return xs, ks, A, Kk, ke, c_next


@helper
def rows16(ptr, t0, I: tl.constexpr, eos, STRIDE: tl.constexpr, ok, m_k):
    """Rows t0 + 16 I .. +16, columns `ok`, of a `[rows, STRIDE]` buffer as fp32 `[16, BK]` (0 outside)."""
    rows = t0 + I * 16 + tl.arange(0, 16)
    p = ptr + rows.to(tl.int64)[:, None] * STRIDE + ok[None, :]
    return tl.load(p, mask=(rows < eos)[:, None] & m_k[None, :], other=0.0).to(tl.float32)


@helper
def sub_chunks(ptr, t0, eos, STRIDE: tl.constexpr, ok, m_k):
    """The chunk's four 16-row sub-chunks of a `[rows, STRIDE]` buffer (`rows16` of each)."""
    return (
        rows16(ptr, t0, 0, eos, STRIDE, ok, m_k),
        rows16(ptr, t0, 1, eos, STRIDE, ok, m_k),
        rows16(ptr, t0, 2, eos, STRIDE, ok, m_k),
        rows16(ptr, t0, 3, eos, STRIDE, ok, m_k),
    )


@helper
def store_rows16(ptr, x, t0, I: tl.constexpr, eos, STRIDE: tl.constexpr, ok, m_k):
    rows = t0 + I * 16 + tl.arange(0, 16)
    p = ptr + rows.to(tl.int64)[:, None] * STRIDE + ok[None, :]
    tl.store(p, x, mask=(rows < eos)[:, None] & m_k[None, :])


@helper
def token_row(pk, pg, row, eos, KS: tl.constexpr, GS: tl.constexpr, ok, m_k):
    """(g, k) of one token at channels ok, fp32 `[BK]` each (0 past eos)."""
    m = m_k & ((ok * 0 + row) < eos)  # a vector mask: the interpreter rejects a 0-d one
    g_i = tl.load(pg + row.to(tl.int64) * GS + ok, mask=m, other=0.0).to(tl.float32)
    k_i = tl.load(pk + row.to(tl.int64) * KS + ok, mask=m, other=0.0).to(tl.float32)
    return g_i, k_i


@helper
def diag_column(xq, xk, bI, b_i, k_i, i, Aq, Ak):
    """Column i of a sub-chunk's diagonal blocks: Σ_c x_rc k_ic e^{b_rc − b_ic} for q and k rows.

    Rows r < i get exponent 0 (finite); their entries are dropped by the caller's mask.
    """
    o = tl.arange(0, 16)
    ke = k_i[None, :] * tl.exp(tl.where(o[:, None] >= i, bI - b_i[None, :], 0.0))
    Aq = tl.where(o[None, :] == i, rsum(xq * ke, 1)[:, None], Aq)
    Ak = tl.where(o[None, :] == i, rsum(xk * ke, 1)[:, None], Ak)
    return Aq, Ak


@helper
def diag16(xq, xk, bI, c, pk, pg, t0, I: tl.constexpr, eos, KS: tl.constexpr, GS: tl.constexpr, ok, m_k):
    """Channel sums of q_r k_i e^{b_r − b_i} and k_r k_i e^{b_r − b_i} in sub-chunk I (`[16, 16]`,
    entries with r < i are junk, masked by the caller).

    Column i takes row i of k and g straight from memory and carries b_i as a running sum from c
    (b before the sub-chunk), so no row is extracted from a register tile (a cross-thread
    reduction per row, which would dominate the kernel).
    """
    Aq = tl.zeros([16, 16], dtype=tl.float32)
    Ak = tl.zeros([16, 16], dtype=tl.float32)
    b_i = c
    for i in range(16):
        g_i, k_i = token_row(pk, pg, t0 + I * 16 + i, eos, KS, GS, ok, m_k)
        b_i += g_i
        Aq, Ak = diag_column(xq, xk, bI, b_i, k_i, i, Aq, Ak)
    return Aq, Ak


@helper
def add_parts(acc_q, acc_k, x_q, x_k, WANT_Q: tl.constexpr, WANT_K: tl.constexpr):
    """(acc_q + x_q, acc_k + x_k), each sum formed only where the launch wants that part; the other
    accumulator passes through unchanged."""
    if WANT_Q:
        acc_q += x_q
    if WANT_K:
        acc_k += x_k
    return acc_q, acc_k


@helper
def add_sub_chunk(
    d, e, pq, pk, pg, pgc, t0, I: tl.constexpr, eos, c, KS: tl.constexpr, GS: tl.constexpr, ok, m_k,
    DOT: tl.constexpr, SPAN: tl.constexpr, WANT_Q: tl.constexpr, WANT_K: tl.constexpr,
):  # fmt: skip
    """`sub_chunk` I with its diagonal blocks added into the accumulators d (Aqk's) and e (Akk's) by
    `add_parts`: (xs, ks, its keys referenced to its end, c', d, e)."""
    xs, ks, A, Kk, ke, c = sub_chunk(pq, pk, pg, pgc, t0, I, eos, c, KS, GS, ok, m_k, DOT, SPAN,
                                     WANT_Q, WANT_K)  # fmt: skip
    d, e = add_parts(d, e, A, Kk, WANT_Q, WANT_K)
    return xs, ks, ke, c, d, e


@helper
def add_scores(acc_q, acc_k, xs, ks, kr, DOT: tl.constexpr, WANT_Q: tl.constexpr, WANT_K: tl.constexpr):
    """`add_parts` of the off-diagonal blocks xs·kr and ks·kr (`[16, 16]`), each dot formed only where
    the launch wants that part."""
    if WANT_Q:
        acc_q += mm(xs, kr, DOT)
    if WANT_K:
        acc_k += mm(ks, kr, DOT)
    return acc_q, acc_k


@triton.jit
def kda_intra_fwd_kernel(
    q, k, g, beta, gcum, Ainv, Aqk, cu_seqlens, chunk_indices, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT: tl.constexpr, SPAN: tl.constexpr, PART: tl.constexpr,
):  # fmt: skip
    """PART 1: Aqk; PART 2: gcum and Ainv. Two launches, each with half the live accumulators of
    one kernel forming both (which spills 128-280 B per thread offline at every config)."""
    tl.static_assert(PART == 1 or PART == 2, "PART 1 forms Aqk, PART 2 gcum and T")
    WANT_Q: tl.constexpr = PART == 1
    WANT_K: tl.constexpr = PART == 2
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_hv, i_h, i_t, bos, eos, _ = chunk_head(i_c, i_bh, cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    t0 = bos + i_t * BT
    pq, pk = q + i_h * K, k + i_h * K
    pg, pgc = g + i_hv * K, gcum + i_hv * K
    be0 = load_vec16(beta + i_hv, t0, 0, eos, HV)
    be1 = load_vec16(beta + i_hv, t0, 1, eos, HV)
    be2 = load_vec16(beta + i_hv, t0, 2, eos, HV)
    be3 = load_vec16(beta + i_hv, t0, 3, eos, HV)

    z = tl.zeros([16, 16], dtype=tl.float32)
    d0, d1, d2, d3, e0, e1, e2, e3 = z, z, z, z, z, z, z, z
    q10, q20, q21, q30, q31, q32 = z, z, z, z, z, z
    a10, a20, a21, a30, a31, a32 = z, z, z, z, z, z
    for i_k in range(tl.cdiv(K, BK)):
        ok = i_k * BK + tl.arange(0, BK)
        m_k = ok < K
        # One sub-chunk I at a time, so few tiles are live at once. c: b before sub-chunk I (the
        # running chunk-local cumsum; padded rows load g = 0, so b stays at the chunk's last value
        # there). After I, only K_I ⊙ e^{c_{I+1} − b_I} (≤ |K_I|) is kept: a later sub-chunk J
        # scales it by the vector e^{c_J − c_{I+1}} ≤ 1 for its off-diagonal blocks.
        c = tl.zeros([BK], dtype=tl.float32)
        xs, ks, ke0, c, d0, e0 = add_sub_chunk(d0, e0, pq, pk, pg, pgc, t0, 0, eos, c, H * K, HV * K,
                                               ok, m_k, DOT, SPAN, WANT_Q, WANT_K)  # fmt: skip
        c1 = c
        xs, ks, ke1, c, d1, e1 = add_sub_chunk(d1, e1, pq, pk, pg, pgc, t0, 1, eos, c, H * K, HV * K,
                                               ok, m_k, DOT, SPAN, WANT_Q, WANT_K)  # fmt: skip
        q10, a10 = add_scores(q10, a10, xs, ks, tl.trans(ke0), DOT, WANT_Q, WANT_K)
        c2 = c
        xs, ks, ke2, c, d2, e2 = add_sub_chunk(d2, e2, pq, pk, pg, pgc, t0, 2, eos, c, H * K, HV * K,
                                               ok, m_k, DOT, SPAN, WANT_Q, WANT_K)  # fmt: skip
        q20, a20 = add_scores(q20, a20, xs, ks, tl.trans(rescale(ke0, c2 - c1)), DOT, WANT_Q, WANT_K)
        q21, a21 = add_scores(q21, a21, xs, ks, tl.trans(ke1), DOT, WANT_Q, WANT_K)
        c3 = c
        xs, ks, ke3, c, d3, e3 = add_sub_chunk(d3, e3, pq, pk, pg, pgc, t0, 3, eos, c, H * K, HV * K,
                                               ok, m_k, DOT, SPAN, WANT_Q, WANT_K)  # fmt: skip
        q30, a30 = add_scores(q30, a30, xs, ks, tl.trans(rescale(ke0, c3 - c1)), DOT, WANT_Q, WANT_K)
        q31, a31 = add_scores(q31, a31, xs, ks, tl.trans(rescale(ke1, c3 - c2)), DOT, WANT_Q, WANT_K)
        q32, a32 = add_scores(q32, a32, xs, ks, tl.trans(ke2), DOT, WANT_Q, WANT_K)

    o = tl.arange(0, 16)
    strict = o[:, None] > o[None, :]
    lower = o[:, None] >= o[None, :]
    if WANT_K:
        Ad = stack4(
            tl.where(strict, e0 * be0[:, None], 0.0),
            tl.where(strict, e1 * be1[:, None], 0.0),
            tl.where(strict, e2 * be2[:, None], 0.0),
            tl.where(strict, e3 * be3[:, None], 0.0),
        )
        T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = inv_unit_lower64(
            Ad,
            a10 * be1[:, None],
            a20 * be2[:, None],
            a21 * be2[:, None],
            a30 * be3[:, None],
            a31 * be3[:, None],
            a32 * be3[:, None],
            DOT,
        )
        store_lower64(Ainv + i_hv * BT, t0, eos, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, HV, BT)
    if WANT_Q:
        store_lower64(
            Aqk + i_hv * BT,
            t0,
            eos,
            tl.where(lower, d0 * scale, 0.0),
            q10 * scale,
            tl.where(lower, d1 * scale, 0.0),
            q20 * scale,
            q21 * scale,
            tl.where(lower, d2 * scale, 0.0),
            q30 * scale,
            q31 * scale,
            q32 * scale,
            tl.where(lower, d3 * scale, 0.0),
            HV,
            BT,
        )
