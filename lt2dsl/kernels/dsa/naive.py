"""Query-by-query DSA (DeepSeek Sparse Attention): the numerical truth for `dsa` (float64-capable).

Follows the peer's reference (fla `fla/ops/dsa/naive.py`): the lightning indexer scores every causal
key s ≤ t as I[t, s] = Σ_j w_idx[t, j] · ReLU(idx_scale · q_idx[t, j] · k_idx[s]) (one index key per
token shared by the HI indexer heads), keeps the top-k (fewer when fewer keys are visible), and all
query heads attend over that one selection (mixers.md §11). Ties: the lower key index wins.
"""

from __future__ import annotations

import torch

from ..common.attn_utils import compute_dtype, repeat_kv


def indexer_scores_row(q_idx_t, k_idx, w_idx_t, idx_scale: float) -> torch.Tensor:
    """Index scores of one query over keys: q_idx_t `[HI, DI]`, k_idx `[S, DI]`, w_idx_t `[HI]` -> `[S]`."""
    dots = torch.relu(idx_scale * (q_idx_t @ k_idx.transpose(0, 1)))  # [HI, S]
    return dots.sum(0) if w_idx_t is None else (w_idx_t[:, None] * dots).sum(0)


def dsa_indexer_naive(q_idx, k_idx, w_idx=None, *, topk: int, idx_scale: float | None = None):
    """Top-k causal keys per query, in rank order, padded with −1.

    Args:
        q_idx (torch.Tensor): `[B, Tq, HI, DI]` index queries (last Tq positions).
        k_idx (torch.Tensor): `[B, Tk, DI]` index keys.
        w_idx (torch.Tensor, Optional): `[B, Tq, HI]` head weights (None: all ones).
        topk (int): keys kept per query.
        idx_scale (float, Optional): default `DI ** -0.5`.

    Returns:
        indices (torch.LongTensor): `[B, Tq, topk]`.
    """
    B, Tq, _, DI = q_idx.shape
    Tk = k_idx.shape[1]
    idx_scale = DI**-0.5 if idx_scale is None else idx_scale
    dt = compute_dtype(q_idx, k_idx, w_idx)
    out = torch.full((B, Tq, topk), -1, dtype=torch.long, device=q_idx.device)
    for b in range(B):
        for i in range(Tq):
            pos = i + Tk - Tq
            w = None if w_idx is None else w_idx[b, i].to(dt)
            s = indexer_scores_row(q_idx[b, i].to(dt), k_idx[b, : pos + 1].to(dt), w, idx_scale)
            order = torch.sort(s.double(), descending=True, stable=True)[1][:topk]
            out[b, i, : order.numel()] = order
    return out


def dsa_naive(
    q, k, v, q_idx, k_idx, w_idx=None, *, topk: int, scale=None, idx_scale=None, indices=None
) -> tuple[torch.Tensor, torch.LongTensor]:
    """Sparse attention over the indexer's selection, one query at a time.

    Args:
        q (torch.Tensor): `[B, Tq, HQ, K]`; k `[B, Tk, HKV, K]`; v `[B, Tk, HKV, V]`.
        q_idx, k_idx, w_idx: indexer inputs (see `dsa_indexer_naive`); ignored when `indices` is given.
        indices (torch.LongTensor, Optional): `[B, Tq, topk]` precomputed selection (−1 = empty).

    Returns:
        (o `[B, Tq, HQ, V]` in the dtype of v, indices `[B, Tq, topk]`).
    """
    B, Tq, HQ, K = q.shape
    Tk, HKV = k.shape[1:3]
    scale = K**-0.5 if scale is None else scale
    if indices is None:
        indices = dsa_indexer_naive(q_idx, k_idx, w_idx, topk=topk, idx_scale=idx_scale)
    dt = compute_dtype(q, k, v)
    kx, vx = (repeat_kv(x, HQ // HKV).to(dt) for x in (k, v))
    rows = []
    for b in range(B):
        for i in range(Tq):
            pos = i + Tk - Tq
            sel = indices[b, i]
            sel = torch.unique(sel[(sel >= 0) & (sel <= pos)])
            s = torch.einsum("hk,nhk->hn", q[b, i].to(dt) * scale, kx[b, sel])
            p = torch.softmax(s, dim=-1)
            o = torch.einsum("hn,nhv->hv", p, vx[b, sel])
            rows.append(o if sel.numel() else torch.zeros_like(o))
    o = torch.stack(rows).view(B, Tq, HQ, v.shape[-1])
    return o.to(v.dtype), indices
