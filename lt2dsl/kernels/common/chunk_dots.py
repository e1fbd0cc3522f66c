"""Device helpers shared by the chunked linear-attention kernels (simple_gla, mlstm)."""

from __future__ import annotations

import triton.language as tl

from .tiles import cast, device_fn, load_tile, mma


@device_fn
def state_and_scores(
    a, b, s, i_c, i_v, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PREC: tl.constexpr, SCORES_FIRST: tl.constexpr,
):  # fmt: skip
    """Over the key blocks of chunk `i_c`: (A S `[BT, BV]`, A Bᵀ `[BT, BT]`), both fp32.

    a, b: `[T, H, K]` rows (one head, from the sequence start), s: the chunk's `[K, V]` state, value
    block `i_v`. A Bᵀ is formed directly from b loaded transposed. SCORES_FIRST: each key step issues
    the A Bᵀ dot before the A S dot (the order each caller's kernel was tuned with)."""
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_a = load_tile(a, i_c * BT, i_k * BK, T, K, H * K, 1, BT, BK)
        b_bT = load_tile(b, i_k * BK, i_c * BT, K, T, 1, H * K, BK, BT)
        b_s = load_tile(s, i_k * BK, i_v * BV, K, V, V, 1, BK, BV)
        if SCORES_FIRST:
            b_A += mma(b_a, b_bT, PREC)
            b_o += mma(b_a, cast(b_s, b_a.dtype), PREC)
        else:
            b_o += mma(b_a, cast(b_s, b_a.dtype), PREC)
            b_A += mma(b_a, b_bT, PREC)
    return b_o, b_A
