"""Triton building blocks shared by the delta-rule kernels (DeltaNet, GDN, KDA).

Conventions of every kernel in the family:

* Tensors are flattened over batch and time: q, k `[B*T, H, K]`, v `[B*T, HV, V]`, gates `[B*T, HV(, K)]`
  (contiguous). A sequence is the row range [bos, eos): `b*T .. (b+1)*T`, or a `cu_seqlens` segment.
* Chunks of BT = 64 tokens, split into four 16-token sub-chunks where a kernel needs 16 x 16 blocks
  (the triangular inverse, KDA's gated products). Per-chunk 64 x 64 matrices are stored row by row
  next to the tokens: `[B*T, HV, 64]`.
* `DOT` selects how `tl.dot` runs: 0 = tensor cores (16-bit operands, or TF32 for fp32 ones),
  1 = fp32 inputs: "tf32x3" (the tests hold fp32 to 1e-4, which plain TF32 would miss), 2 = Triton's
  CPU interpreter, whose `tl.dot` multiplies 16-bit floats as integers, so operands are widened.
* `PREC` (16-bit inputs): dots whose rounding accumulates into the state or the innovations U'
  run with fp32-grade operands (`mm_xx`: TF32; `delta_grad.mm_xr`: hi + lo split of the computed side).
  With bf16 operands everywhere the chunked forms land at ~1% relative RMS against float64 (the
  whole bf16 budget: cancellation between the inter- and intra-chunk terms); measured per dot
  site, Q·S and K·S can stay bf16 while T·X, P·U' and Kᵀ·U' must not.
* No kernel transposes a `tl.dot` result (Hopper miscompile in Triton 3.4–3.7.0, see
  /work/shared/bench/README.md); transposed products are recomputed from loaded operands instead.
"""

from __future__ import annotations

import triton.language as tl

from lt2dsl.kernels.common.tl_util import head_split, helper, tile_head_program

DOT_NATIVE, DOT_IEEE, DOT_INTERP = 0, 1, 2


@helper
def rsum(x, axis: tl.constexpr):
    """tl.sum of an fp32 tensor, spelled as the reduction tl.sum lowers to.

    Same code on the GPU; the interpreter maps this combine function to one numpy call instead of
    entering the `tl.sum` wrapper (≈2 ms a call on CPU).
    """
    return tl.reduce(x, axis, tl.standard._sum_combine)


@helper
def rcumsum(x, axis: tl.constexpr):
    """tl.cumsum of an fp32 tensor (inclusive), spelled as the scan it lowers to; see `rsum`."""
    return tl.associative_scan(x, axis, tl.standard._sum_combine)


@helper
def mm(a, b, DOT: tl.constexpr):
    """a @ b with fp32 accumulation; operands are already in the kernel's dot dtype."""
    if DOT == 2:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif DOT == 1:
        # fp32 inputs: three TF32 products on the tensor cores (~fp32 accuracy); "ieee" lowers to
        # FMA loops that spill kilobytes per thread at these tile sizes.
        r = tl.dot(a, b, input_precision="tf32x3")
    else:
        r = tl.dot(a, b)
    return r


@helper
def split16(x, DT: tl.constexpr):
    """fp32 x as hi + lo, both in the 16-bit dtype DT: |x − hi − lo| ≤ 2⁻¹⁶ |x|."""
    hi = x.to(DT)
    return hi, (x - hi.to(tl.float32)).to(DT)


@helper
def causal_scores(x, y, b, n, scale, BT: tl.constexpr, USE_G: tl.constexpr, TRANSPOSED: tl.constexpr,
                  DOT: tl.constexpr):  # fmt: skip
    """The chunk's output scores P[r, i] = s (q_r · k_i) e^{b_r − b_i} for i ≤ r < n, else 0, from
    x = Q, y = K `[BT, BK]`; with TRANSPOSED, Pᵀ[i, r] from x = K, y = Q (formed directly, so no dot
    result is transposed). Kept exponents are ≤ 0; the others are zeroed before exp, and rows past
    n (whose b may be anything) are dropped."""
    o = tl.arange(0, BT)
    if TRANSPOSED:
        keep = (o[None, :] >= o[:, None]) & (o < n)[None, :]
        diff = b[None, :] - b[:, None]
    else:
        keep = (o[:, None] >= o[None, :]) & (o < n)[:, None]
        diff = b[:, None] - b[None, :]
    p = mm(x, tl.trans(y), DOT) * scale
    if USE_G:
        p = p * tl.exp(tl.where(keep, diff, 0.0))
    return tl.where(keep, p, 0.0)


@helper
def mm_xx(a, b, DT: tl.constexpr, PREC: tl.constexpr, DOT: tl.constexpr):
    """a @ b for two computed fp32 tiles: TF32 on the tensor cores with PREC (8x finer than bf16;
    exact fp32 under the interpreter), else DT operands."""
    if PREC:
        r = mm(a, b, DOT)
    else:
        r = mm(a.to(DT), b.to(DT), DOT)
    return r


@helper
def mm_xr(a, b, DT: tl.constexpr, PREC: tl.constexpr, DOT: tl.constexpr):
    """a @ b for a computed fp32 `a` and a raw 16-bit `b`: with PREC, `a` enters as hi + lo 16-bit
    terms (two MMAs, ~fp32 accuracy) while `b` stays a 16-bit operand; else one DT dot."""
    if PREC:
        hi, lo = split16(a, DT)
        r = mm(hi, b, DOT) + mm(lo, b, DOT)
    else:
        r = mm(a.to(DT), b, DOT)
    return r


@helper
def mm_acc(a, b, acc, DOT: tl.constexpr):
    """acc + a @ b summed in the MMA's accumulator; operands already in the kernel's dot dtype."""
    if DOT == 2:
        r = acc + tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif DOT == 1:
        r = tl.dot(a, b, acc, input_precision="tf32x3")
    else:
        r = tl.dot(a, b, acc)
    return r


@helper
def mm_xr_acc(a, b, acc, DT: tl.constexpr, PREC: tl.constexpr, DOT: tl.constexpr):
    """acc + `mm_xr(a, b)`, summed in the MMA's accumulator."""
    if PREC:
        hi, lo = split16(a, DT)
        r = mm_acc(lo, b, mm_acc(hi, b, acc, DOT), DOT)
    else:
        r = mm_acc(a.to(DT), b, acc, DOT)
    return r


@helper
def mm_f32(a, b, DOT: tl.constexpr):
    """fp32 @ fp32 in full precision (the 16 x 16 steps of the triangular inverse), any `DOT`."""
    return tl.dot(a, b, input_precision="ieee")


@helper
def load_vec16(ptr, t0, I: tl.constexpr, eos, STRIDE: tl.constexpr):
    """Entries t0 + 16 I .. +16 of a strided per-token scalar (β, g) as fp32 `[16]` (0 past eos)."""
    rows = t0 + I * 16 + tl.arange(0, 16)
    return tl.load(ptr + rows.to(tl.int64) * STRIDE, mask=rows < eos, other=0.0).to(tl.float32)


@helper
def seq_bounds(i_n, cu_seqlens, T, IS_VARLEN: tl.constexpr):
    """(bos, eos) of sequence i_n: from `cu_seqlens` with varlen, else row i_n of T tokens."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int32)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int32)
    else:
        bos = i_n * T
        eos = bos + T
    return bos, eos


@helper
def chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN: tl.constexpr):
    """(sequence id, chunk index in the sequence, bos, eos) of chunk program (i_c, i_b).

    Without varlen the grid runs chunks of batch row i_b; with varlen (B == 1) `chunk_indices`
    `[NT_total, 2]` lists (sequence, chunk) for every chunk of the packed batch.
    """
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + 2 * i_c).to(tl.int32)
        i_t = tl.load(chunk_indices + 2 * i_c + 1).to(tl.int32)
    else:
        i_n = i_b
        i_t = i_c
    bos, eos = seq_bounds(i_n, cu_seqlens, T, IS_VARLEN)
    return i_n, i_t, bos, eos


@helper
def seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(bos, eos, number of chunks, index of the first chunk in chunk-indexed buffers) of sequence i_n."""
    bos, eos = seq_bounds(i_n, cu_seqlens, T, IS_VARLEN)
    if IS_VARLEN:
        NT = tl.cdiv(eos - bos, BT)
        boh = tl.load(chunk_offsets + i_n).to(tl.int32)
    else:
        NT = tl.cdiv(T, BT)
        boh = i_n * NT
    return bos, eos, NT, boh


@helper
def chunk_head(
    i_c, i_bh, cu_seqlens, chunk_indices, T,
    H: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """(value head, q/k head, chunk index in its sequence, bos, eos, index of the chunk in
    chunk-indexed buffers) of chunk program (i_c, i_bh = batch row * HV + value head); value head j
    reads q/k head j // (HV // H)."""
    i_b, i_hv, i_h = head_split(i_bh, H, HV)
    _, i_t, bos, eos = chunk_coords(i_c, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    i_g = i_c if IS_VARLEN else i_b * tl.cdiv(T, BT) + i_c
    return i_hv, i_h, i_t, bos, eos, i_g


@helper
def head_bases(row, i_h, i_hv, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Element offsets of token `row` (int64) at q/k head i_h of a `[B*T, H, K]` buffer and at value
    head i_hv of a `[B*T, HV, V]` one."""
    return (row * H + i_h) * K, (row * HV + i_hv) * V


@helper
def seq_program(
    cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """A state scan's program (V tile i_v, sequence program i_nh = sequence * HV + value head): (i_v,
    i_nh, value head, q/k head, `seq_coords` of the sequence, its length L, bos as int64, the
    `head_bases` of its first token, the offset of its `[K, V]` state)."""
    i_v, i_nh, i_n, i_hv, i_h = tile_head_program(H, HV)
    bos, eos, NT, boh = seq_coords(i_n, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN)
    L = eos - bos
    b64 = bos.to(tl.int64)
    k_base, v_base = head_bases(b64, i_h, i_hv, H, HV, K, V)
    s_base = i_nh.to(tl.int64) * K * V
    return i_v, i_nh, i_hv, i_h, bos, eos, NT, boh, L, b64, k_base, v_base, s_base


@helper
def chunk_tile_program(
    cu_seqlens, chunk_indices, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """A per-chunk program over V tiles (i_v, chunk program i_c, i_bh): (i_v, value head, q/k head, index
    of the chunk in chunk-indexed buffers, first token t0, eos, rows n = eos − t0, the `head_bases`
    of t0)."""
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hv, i_h, i_t, bos, eos, i_g = chunk_head(i_c, i_bh, cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    t0 = bos + i_t * BT
    n = eos - t0
    t64 = t0.to(tl.int64)
    qk_base, v_base = head_bases(t64, i_h, i_hv, H, HV, K, V)
    return i_v, i_hv, i_h, i_g, t0, eos, n, qk_base, v_base


@helper
def stack4(X0, X1, X2, X3):
    """Four equal 2-D tiles as one `[4, M, N]` tensor (sub-chunk index first)."""
    blk = tl.arange(0, 4)[:, None, None]
    return tl.where(
        blk == 0,
        X0[None, :, :],
        tl.where(blk == 1, X1[None, :, :], tl.where(blk == 2, X2[None, :, :], X3[None, :, :])),
    )


@helper
def pick4(X, I: tl.constexpr):
    """Tile I of a `[4, M, N]` stack."""
    return rsum(tl.where(tl.arange(0, 4)[:, None, None] == I, X, 0.0), 0)


@helper
def inv_unit_lower16x4(A):
    """(I + A_j)^{-1} of four strictly lower 16 x 16 fp32 blocks stacked as `[4, 16, 16]`.

    Forward substitution, each of the 14 steps serving all four blocks: row i of T = (I + A)^{-1}
    is e_i − Σ_{j<i} A_ij T_j; R holds T − I row by row (rows 0 and 1 are −A already), so a step
    is one row of −A plus a vector-matrix product with R.
    """
    o = tl.arange(0, 16)
    row = o[None, :, None]
    R = -A
    for i in tl.static_range(2, 16):
        a = -rsum(tl.where(row == i, A, 0.0), 1)  # [4, 16]: row i of −A_j, indexed by column
        a = a + rsum(a[:, :, None] * R, 1)
        R = tl.where(row == i, a[:, None, :], R)
    return R + tl.where(o[:, None] == o[None, :], 1.0, 0.0)[None, :, :]


@helper
def inv_unit_lower64(Ad, A10, A20, A21, A30, A31, A32, DOT: tl.constexpr):
    """(I + A)^{-1} of a strictly lower 64 x 64 matrix: diagonal blocks stacked `[4, 16, 16]`, then
    the six 16 x 16 blocks below them.

    Diagonal blocks by substitution, then T_IJ = −T_II Σ_{J≤m<I} A_Im T_mJ (block forward
    substitution), all in fp32. Returns the ten lower blocks T00, T10, T11, T20, ... T33.
    """
    Td = inv_unit_lower16x4(Ad)
    return inv_block_lower64(Td, A10, A20, A21, A30, A31, A32, DOT)


@helper
def inv_block_lower64(Td, A10, A20, A21, A30, A31, A32, DOT: tl.constexpr):
    """`inv_unit_lower64` given the inverted diagonal blocks `Td` `[4, 16, 16]`."""
    T00 = pick4(Td, 0)
    T11 = pick4(Td, 1)
    T22 = pick4(Td, 2)
    T33 = pick4(Td, 3)
    T10 = -mm_f32(T11, mm_f32(A10, T00, DOT), DOT)
    T21 = -mm_f32(T22, mm_f32(A21, T11, DOT), DOT)
    T32 = -mm_f32(T33, mm_f32(A32, T22, DOT), DOT)
    T20 = -mm_f32(T22, mm_f32(A20, T00, DOT) + mm_f32(A21, T10, DOT), DOT)
    T31 = -mm_f32(T33, mm_f32(A31, T11, DOT) + mm_f32(A32, T21, DOT), DOT)
    T30 = -mm_f32(T33, mm_f32(A30, T00, DOT) + mm_f32(A31, T10, DOT) + mm_f32(A32, T20, DOT), DOT)
    return T00, T10, T11, T20, T21, T22, T30, T31, T32, T33


@helper
def block_rows(ptr, t0, I: tl.constexpr, eos, HV: tl.constexpr, BT: tl.constexpr):
    """(pointers `[16, 16]` to columns 0..15, row mask) of sub-chunk I of a `[B*T, HV, BT]` buffer.

    `ptr` already points at head hv of row 0; add 16 J to reach block column J.
    """
    o = tl.arange(0, 16)
    rows = t0 + I * 16 + o
    return ptr + rows.to(tl.int64)[:, None] * (HV * BT) + o[None, :], (rows < eos)[:, None]


@helper
def store_block_row(p, m, X0, X1, X2, X3):
    """Store the four `[16, 16]` blocks X0..X3 as the columns 0..63 of one block row (`block_rows`)."""
    tl.store(p, X0, mask=m)
    tl.store(p + 16, X1, mask=m)
    tl.store(p + 32, X2, mask=m)
    tl.store(p + 48, X3, mask=m)


@helper
def store_lower64(
    p, t0, eos, X00, X10, X11, X20, X21, X22, X30, X31, X32, X33, HV: tl.constexpr, BT: tl.constexpr
):
    """Write a block lower-triangular 64 x 64 matrix, zeros above the block diagonal included."""
    z = tl.zeros([16, 16], dtype=tl.float32)
    p0, m0 = block_rows(p, t0, 0, eos, HV, BT)
    p1, m1 = block_rows(p, t0, 1, eos, HV, BT)
    p2, m2 = block_rows(p, t0, 2, eos, HV, BT)
    p3, m3 = block_rows(p, t0, 3, eos, HV, BT)
    store_block_row(p0, m0, X00, z, z, z)
    store_block_row(p1, m1, X10, X11, z, z)
    store_block_row(p2, m2, X20, X21, X22, z)
    store_block_row(p3, m3, X30, X31, X32, X33)
