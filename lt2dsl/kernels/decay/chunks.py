"""Chunk bookkeeping of the decay family's kernels: fixed-length or packed batches (`Varlen`), the
span of a sequence or a grid chunk inside a kernel, and the chunk-local cumulative sum of the gates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.backend import new_empty
from ..common.tiles import device_fn, load_tile, store_tile
from .utils import chunk_indices, chunk_offsets

CHUNK = 64


class Varlen:
    """Chunk bookkeeping for one call: fixed-length batch or packed sequences (`cu_seqlens`).

    Attributes: `cu` (int32 `[N + 1]` or None), `idx` (`[NT_total, 2]` (sequence, chunk) pairs),
    `offsets` (`[N + 1]` first chunk of each sequence), `N`, `NT` (chunks per row of the grid),
    `n_chunks` (all chunks: the leading dim of per-chunk states).
    """

    def __init__(self, cu_seqlens: torch.Tensor | None, B: int, T: int, chunk: int = CHUNK):
        self.chunk = chunk
        if cu_seqlens is None:
            self.cu = self.idx = self.offsets = None
            self.N, self.NT = B, triton.cdiv(T, chunk)
            self.n_chunks = B * self.NT
        else:
            self.cu = cu_seqlens.to(torch.int32)
            self.idx = chunk_indices(cu_seqlens, chunk)
            self.offsets = chunk_offsets(cu_seqlens, chunk)
            self.N, self.NT = cu_seqlens.numel() - 1, self.idx.shape[0]
            self.n_chunks = self.NT

    @property
    def is_varlen(self) -> bool:
        return self.cu is not None

    def grid_rows(self, B: int) -> int:
        """Grid extent along batch: B rows of NT chunks, or 1 packed row of all chunks."""
        return 1 if self.is_varlen else B


@device_fn
def seq_start(i_n, cu_seqlens, T, IS_VARLEN: tl.constexpr):
    """(first token as int64, length) of sequence i_n: from `cu_seqlens` with varlen, else row i_n
    of T tokens."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        bos = i_n.to(tl.int64) * T
    return bos, T


@device_fn
def seq_span(i_n, cu_seqlens, chunk_offsets, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(first token, length, first chunk) of sequence i_n."""
    bos, T = seq_start(i_n, cu_seqlens, T, IS_VARLEN)
    if IS_VARLEN:
        boc = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        boc = i_n.to(tl.int64) * tl.cdiv(T, BT)
    return bos, T, boc


@device_fn
def chunk_span(i_t, i_b, cu_seqlens, chunk_idx, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Grid chunk i_t of batch row i_b → (sequence, chunk in it, global chunk, first token, length)."""
    if IS_VARLEN:
        i_tg = i_t.to(tl.int64)
        i_n = tl.load(chunk_idx + 2 * i_t)
        i_c = tl.load(chunk_idx + 2 * i_t + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        i_n = i_b
        i_c = i_t
        i_tg = i_b.to(tl.int64) * tl.cdiv(T, BT) + i_t
        bos = i_b.to(tl.int64) * T
    return i_n, i_c, i_tg, bos, T


@triton.jit(do_not_specialize=["T"])
def chunk_cumsum_kernel(
    g, out, cu_seqlens, chunk_idx, T,
    HV: tl.constexpr, S: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """Chunk-local cumulative sum of g `[B, T, HV, S]` along T (restarting every BT tokens), fp32."""
    i_s, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // HV, i_bh % HV
    _, i_c, _, bos, T = chunk_span(i_t, i_b, cu_seqlens, chunk_idx, T, BT, IS_VARLEN)
    base = (bos * HV + i_h) * S
    b_g = load_tile(g + base, i_c * BT, i_s * BS, T, S, HV * S, 1, BT, BS).to(tl.float32)
    b_g = tl.cumsum(b_g, axis=0)
    store_tile(out + base, b_g, i_c * BT, i_s * BS, T, S, HV * S, 1, BT, BS)


def chunk_local_cumsum(g: torch.Tensor, vl: Varlen) -> torch.Tensor:
    """Cumulative sum of g (`[B, T, HV]` or `[B, T, HV, K]`) inside every chunk, in fp32."""
    B, T, HV = g.shape[:3]
    S = g.shape[3] if g.dim() == 4 else 1
    g = g.contiguous()
    out = new_empty(g, *g.shape, dtype=torch.float32)
    BS = min(64, triton.next_power_of_2(S))
    grid = (triton.cdiv(S, BS), vl.NT, vl.grid_rows(B) * HV)
    chunk_cumsum_kernel[grid](
        g, out, vl.cu, vl.idx, T, HV=HV, S=S, BT=vl.chunk, BS=BS, IS_VARLEN=vl.is_varlen
    )
    return out
