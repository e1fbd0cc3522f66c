"""Device helper for packed (variable-length) sequences shared by the token-recurrent kernels."""

from __future__ import annotations

import triton.language as tl

from .tiles import device_fn


@device_fn
def seq_bounds(i_n, cu_seqlens, T, IS_VARLEN: tl.constexpr):
    """(first token `int64`, length) of sequence i_n: from `cu_seqlens` `[N + 1]` when packed, else
    row i_n of a `[B, T]` batch."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        bos = i_n.to(tl.int64) * T
    return bos, T
