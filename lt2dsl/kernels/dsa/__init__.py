"""`dsa`: DeepSeek Sparse Attention (lightning indexer, causal top-k, attention over the selection).

Argument conventions follow the peer's reference (fla `fla/ops/dsa/naive.py`), so both compute the
same function on the same inputs: one selection per query shared by all query and kv heads (as the peer
does and mixers.md §11 says), ReLU before the per-head weights, `idx_scale` default `DI ** -0.5`.
Ties in the index score: the lower key index wins (the peer leaves ties to `torch.topk`).
Files: `naive.py` (per-query truth), `reference.py` (vectorised PyTorch), `loss.py` (KL alignment),
`triton_*.py` (indexer and sparse-attention kernels), `ops.py` (torch.library).
"""

from __future__ import annotations

import torch

from ..common.attn_utils import check_qkv, run_by_sequence
from ..common.backend import check_float, check_shape, resolve_backend
from .loss import dsa_indexer_kl
from .naive import dsa_indexer_naive, dsa_naive
from .reference import dsa_indexer_reference, dsa_reference

__all__ = ["dsa", "dsa_indexer", "dsa_indexer_kl", "dsa_indexer_naive", "dsa_naive", "dsa_reference"]


def dsa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    q_idx: torch.Tensor | None, k_idx: torch.Tensor | None, w_idx: torch.Tensor | None = None,
    *, topk: int = 2048, scale: float | None = None, idx_scale: float | None = None,
    indices: torch.LongTensor | None = None, cu_seqlens: torch.LongTensor | None = None,
    return_indices: bool = False, backend: str = "reference",
):  # fmt: skip
    """DSA forward; differentiable in q, k, v (no gradient through the discrete selection).

    Args:
        q (torch.Tensor): queries `[B, Tq, HQ, K]` (the last Tq positions when Tq < Tk: decode).
        k (torch.Tensor): keys `[B, Tk, HKV, K]`, GQA group G = HQ // HKV.
        v (torch.Tensor): values `[B, Tk, HKV, V]`.
        q_idx (torch.Tensor): index queries `[B, Tq, HI, DI]`.
        k_idx (torch.Tensor): index keys `[B, Tk, DI]`, one per token, shared by the HI heads.
        w_idx (torch.Tensor, Optional): per-head index weights `[B, Tq, HI]`; None sums the heads.
        topk (int): keys selected per query. Default: `2048`.
        scale (float, Optional): attention scale; default `K ** -0.5`.
        idx_scale (float, Optional): index-score scale inside the ReLU; default `DI ** -0.5`.
        indices (torch.LongTensor, Optional): `[B, Tq, topk]` precomputed selection (−1 pads);
            the indexer is skipped.
        cu_seqlens (torch.LongTensor, Optional): packed sequences with `B == 1`; indices are local
            to each sequence (peer convention). Default: `None`.
        return_indices (bool, Optional): also return the selection. Default: `False`.
        backend (str, Optional): "reference", "triton" or "auto".

    Returns:
        o (torch.Tensor): `[B, Tq, HQ, V]` in the dtype of v; with `return_indices`, also the
        selection `[B, Tq, topk]` (rank order, −1 padded).
    """
    B, Tq, Tk, *_ = check_qkv(q, k, v, cu_seqlens)
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if indices is None:
        _check_indexer(q_idx, k_idx, w_idx, B, Tq, Tk)
    else:
        check_shape("indices", indices, [B, Tq, None], "[B, Tq, topk]")
    if resolve_backend(backend, q) == "triton":
        from .ops import dsa_triton

        o, idx = dsa_triton(
            q,
            k,
            v,
            q_idx,
            k_idx,
            w_idx,
            topk=topk,
            scale=scale,
            idx_scale=idx_scale,
            indices=indices,
            cu_seqlens=cu_seqlens,
            ordered=return_indices,
        )
    else:
        kw = dict(topk=topk, scale=scale, idx_scale=idx_scale)
        if cu_seqlens is None:
            o, idx = dsa_reference(q, k, v, q_idx, k_idx, w_idx, indices=indices, **kw)
        else:
            o, idx = run_by_sequence(
                dsa_reference,
                cu_seqlens,
                dict(q=q, q_idx=q_idx, w_idx=w_idx, indices=indices),
                dict(k=k, v=v, k_idx=k_idx),
                **kw,
            )
    return (o, idx) if return_indices else o


def dsa_indexer(
    q_idx,
    k_idx,
    w_idx=None,
    *,
    topk: int,
    idx_scale=None,
    cu_seqlens=None,
    backend: str = "reference",
    ordered: bool = True,
):
    """The lightning indexer alone: `[B, Tq, topk]` causal top-k key indices (rank order, −1 pads).

    `ordered=False` lets the Triton backend return each query's selection in any order (the same
    set, −1 pads possibly among the indices), skipping the rank sort when only the set matters.
    With `cu_seqlens` (a packed row, B = 1, Tq = Tk) every document selects among its own keys and
    the indices are local to it, as `dsa` takes them."""
    _check_indexer(q_idx, k_idx, w_idx, q_idx.shape[0], q_idx.shape[1], k_idx.shape[1])
    if resolve_backend(backend, q_idx) == "triton":
        from .ops import _indexer

        return _indexer(q_idx, k_idx, w_idx, topk, idx_scale, cu_seqlens, ordered)
    kw = dict(topk=topk, idx_scale=idx_scale)
    if cu_seqlens is None:
        return dsa_indexer_reference(q_idx, k_idx, w_idx, **kw)
    return run_by_sequence(
        dsa_indexer_reference, cu_seqlens, dict(q_idx=q_idx, w_idx=w_idx), dict(k_idx=k_idx), **kw
    )


def _check_indexer(q_idx, k_idx, w_idx, B: int, Tq: int, Tk: int) -> None:
    """q_idx `[B, Tq, HI, DI]`, k_idx `[B, Tk, DI]`, w_idx `[B, Tq, HI]`."""
    check_shape("q_idx", q_idx, [B, Tq, None, None], "[B, Tq, HI, DI]")
    HI, DI = q_idx.shape[2:]
    check_shape("k_idx", k_idx, [B, Tk, DI], "[B, Tk, DI]")
    check_float("q_idx", q_idx)
    if w_idx is not None:
        check_shape("w_idx", w_idx, [B, Tq, HI], "[B, Tq, HI]")
