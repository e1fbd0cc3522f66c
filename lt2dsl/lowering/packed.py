"""Packed rows: several documents laid end to end in one row, their bounds in `cu_seqlens`.

fla's convention: a batch of documents is one row `[1, T]` and `cu_seqlens` (int32 or int64,
`[N + 1]`) holds the document starts `0 = c_0 < c_1 < … < c_N = T`. Every mixer treats each
document as a sequence of its own: no attention across bounds, recurrent states and short-conv
histories start from zeros at every start, and positions (RoPE, xPos, Toeplitz bias) restart at 0.

The helpers below are what the lowering's leaves use for that; they run on the device without
reading `cu_seqlens` back to the host, except `split` (one read per call, for the mixers whose
kernel takes no `cu_seqlens`: `tmm`, `nsa`).
"""

from __future__ import annotations

import itertools

import torch


def check_cu_seqlens(cu_seqlens, input_ids: torch.Tensor, has_cache: bool) -> None:
    """Raise ValueError naming what was expected unless `cu_seqlens` fits `input_ids [1, T]`."""
    if cu_seqlens is None:
        return
    shape = "a 1-D integer tensor [N + 1] = [0, l1, l1 + l2, ..., T]"
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be {shape}, got {_describe(cu_seqlens)}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be {shape} (int32), got dtype {cu_seqlens.dtype}")
    B, T = input_ids.shape
    if B != 1:
        raise ValueError(f"with cu_seqlens the documents are packed in one row: input_ids [1, T], got B={B}")
    if has_cache:
        raise ValueError("cu_seqlens (packed documents) cannot be combined with a decode cache")
    if cu_seqlens.device != input_ids.device:
        raise ValueError(f"cu_seqlens must be on {input_ids.device}, got {cu_seqlens.device}")
    if input_ids.device.type == "meta":
        return
    first, last = int(cu_seqlens[0]), int(cu_seqlens[-1])
    if first != 0 or last != T:
        raise ValueError(f"cu_seqlens must start at 0 and end at T={T}, got [{first}, ..., {last}]")
    if bool((cu_seqlens[1:] <= cu_seqlens[:-1]).any()):
        raise ValueError("cu_seqlens must be strictly increasing (no empty documents)")


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {list(x.shape)}"
    return type(x).__name__


def document_index(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """`[T]` int64: the document each position belongs to."""
    t = torch.arange(T, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].to(torch.int64), t, right=True)


def positions(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """`[T]` int64: each token's position inside its document (0 at every document start)."""
    t = torch.arange(T, device=cu_seqlens.device)
    return t - cu_seqlens.to(torch.int64)[document_index(cu_seqlens, T)]


def padded_index(cu_seqlens: torch.Tensor, T: int, pad: int) -> torch.Tensor:
    """`[T]` int64: where token t lands when `pad` zeros are put before every document.

    A causal conv of width W over that padded row, with W − 1 = `pad`, sees only zeros before
    each document: it equals the conv run on every document alone (`pad_documents`).
    """
    return torch.arange(T, device=cu_seqlens.device) + pad * (document_index(cu_seqlens, T) + 1)


def pad_documents(x: torch.Tensor, cu_seqlens: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`x [1, T, C]` with `pad` zeros before each document → (`[1, T + N·pad, C]`, index `[T]`).

    `y_padded[:, index]` gathers the outputs back to the packed row (`padded_index`).
    """
    T = x.shape[1]
    N = cu_seqlens.shape[0] - 1
    index = padded_index(cu_seqlens, T, pad)
    out = x.new_zeros(x.shape[0], T + N * pad, *x.shape[2:])
    return out.index_copy(1, index, x), index


def split(cu_seqlens: torch.Tensor) -> list[int]:
    """Document lengths (host integers) for `torch.split` along T."""
    bounds = cu_seqlens.tolist()
    return [e - s for s, e in itertools.pairwise(bounds)]
