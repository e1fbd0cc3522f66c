"""Parallel PyTorch form of `dsa`: dense index scores and masked attention over query chunks.

`backend="reference"`; autograd gives the gradients of the attention part (the selection is discrete).
`dsa_indexer_kl_reference` is the indexer's KL loss over dense `[B, c, Tk]` rows, the truth `loss.py`
is tested against.
"""

from __future__ import annotations

import torch

from ..common.attn_utils import compute_dtype, repeat_kv, topk_select


def indexer_scores(q_idx, k_idx, w_idx, idx_scale: float, dt) -> torch.Tensor:
    """I[t, s] of a query chunk: q_idx `[B, c, HI, DI]`, k_idx `[B, Tk, DI]`, w_idx `[B, c, HI]`.

    Returns `[B, c, Tk]` in dtype `dt`.
    """
    dots = torch.relu(idx_scale * torch.einsum("bihd,bjd->bihj", q_idx.to(dt), k_idx.to(dt)))
    if w_idx is None:
        return dots.sum(2)
    return torch.einsum("bihj,bih->bij", dots, w_idx.to(dt))


def causal_keys(i0: int, c: int, Tq: int, Tk: int, device) -> torch.Tensor:
    """`[c, Tk]` causal visibility of keys to query rows i0 … i0 + c − 1 (positions i + Tk − Tq)."""
    pos = torch.arange(i0, i0 + c, device=device)[:, None] + (Tk - Tq)
    return torch.arange(Tk, device=device)[None, :] <= pos


def dsa_indexer_reference(q_idx, k_idx, w_idx=None, *, topk: int, idx_scale=None, chunk: int = 256):
    """Same result as `dsa_indexer_naive`, vectorised over query chunks. Returns `[B, Tq, topk]`."""
    B, Tq, _, DI = q_idx.shape
    Tk = k_idx.shape[1]
    idx_scale = DI**-0.5 if idx_scale is None else idx_scale
    dt = compute_dtype(q_idx, k_idx, w_idx)
    out = []
    for i0 in range(0, Tq, chunk):
        w = None if w_idx is None else w_idx[:, i0 : i0 + chunk]
        s = indexer_scores(q_idx[:, i0 : i0 + chunk], k_idx, w, idx_scale, dt)
        valid = causal_keys(i0, s.shape[1], Tq, Tk, s.device).expand_as(s)
        out.append(topk_select(s, valid, topk))
    return torch.cat(out, dim=1)


def selection_mask(indices: torch.Tensor, i0: int, Tq: int, Tk: int) -> torch.Tensor:
    """`[B, c, Tk]` boolean: key selected by the query and causal (−1 / out-of-range entries drop)."""
    B, c, _ = indices.shape
    m = torch.zeros(B, c, Tk + 1, dtype=torch.bool, device=indices.device)
    m.scatter_(2, torch.where((indices >= 0) & (indices < Tk), indices, Tk), True)
    return m[..., :Tk] & causal_keys(i0, c, Tq, Tk, indices.device)


def masked_softmax(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim restricted to `mask`; a row with no visible entry gives zeros.

    The empty rows are filled with 0 before the softmax so neither the value nor its gradient is NaN.
    """
    s = s.masked_fill(~mask, float("-inf"))
    s = torch.where(mask.any(-1, keepdim=True), s, torch.zeros((), dtype=s.dtype, device=s.device))
    return torch.softmax(s, dim=-1) * mask


def sparse_attention_reference(q, k, v, indices, scale: float, chunk: int = 256) -> torch.Tensor:
    """Attention of each query over its selected keys. q `[B, Tq, HQ, K]` -> `[B, Tq, HQ, V]` (dt)."""
    Tq, HQ = q.shape[1:3]
    Tk, HKV = k.shape[1:3]
    dt = compute_dtype(q, k, v)
    kx, vx = (repeat_kv(x, HQ // HKV).to(dt) for x in (k, v))
    outs = []
    for i0 in range(0, Tq, chunk):
        mask = selection_mask(indices[:, i0 : i0 + chunk], i0, Tq, Tk)
        s = torch.einsum("bihk,bjhk->bhij", q[:, i0 : i0 + chunk].to(dt) * scale, kx)
        p = masked_softmax(s, mask[:, None])
        outs.append(torch.einsum("bhij,bjhv->bihv", p, vx))
    return torch.cat(outs, dim=1)


def dsa_reference(q, k, v, q_idx, k_idx, w_idx=None, *, topk: int, scale=None, idx_scale=None, indices=None):
    """Vectorised `dsa_naive`: returns (o `[B, Tq, HQ, V]` in v's dtype, indices `[B, Tq, topk]`)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if indices is None:
        indices = dsa_indexer_reference(q_idx, k_idx, w_idx, topk=topk, idx_scale=idx_scale)
    return sparse_attention_reference(q, k, v, indices, scale).to(v.dtype), indices


def doc_starts(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """`[T]` int64: the start of the packed document each position of a `[1, T]` row belongs to."""
    cu = cu_seqlens.to(torch.int64)
    seq = torch.searchsorted(cu[1:], torch.arange(T, device=cu.device), right=True)
    return cu[seq]


def to_global(local: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Local per-document indices `[1, T, k]` -> positions in the packed row (−1 stays −1)."""
    start = doc_starts(cu_seqlens.to(local.device), local.shape[1])
    return torch.where(local >= 0, local + start[None, :, None], local)


def dsa_indexer_kl_reference(q, k, q_idx, k_idx, w_idx=None, *, scale=None, idx_scale=None, indices=None):
    """Per-query KL `[B, Tq]` of `dsa_indexer_kl` (one sequence, no `cu_seqlens`), each query chunk
    against every key as a dense masked row: the main attention's probabilities summed over heads
    and L1-normalised (detached) against the log-softmax of the index scores."""
    B, Tq, HQ, K = q.shape
    Tk, HKV = k.shape[1:3]
    scale = K**-0.5 if scale is None else scale
    idx_scale = (q_idx.shape[2] * q_idx.shape[3]) ** -0.5 if idx_scale is None else idx_scale
    dt = compute_dtype(q, k, q_idx, k_idx, w_idx)
    kx = repeat_kv(k.detach(), HQ // HKV).to(dt)
    rows = []
    for i0 in range(0, Tq, 256):
        c = min(256, Tq - i0)
        if indices is None:
            mask = causal_keys(i0, c, Tq, Tk, q.device).expand(B, c, Tk)
        else:
            mask = selection_mask(indices[:, i0 : i0 + c], i0, Tq, Tk)
        s = torch.einsum("bihk,bjhk->bhij", q.detach()[:, i0 : i0 + c].to(dt) * scale, kx)
        p = masked_softmax(s, mask[:, None]).sum(1)
        target = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
        w = None if w_idx is None else w_idx[:, i0 : i0 + c]
        logits = indexer_scores(q_idx[:, i0 : i0 + c], k_idx, w, idx_scale, dt)
        logq = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        kl = torch.where(target > 0, target * (torch.log(target.clamp_min(1e-300)) - logq), 0.0)
        rows.append(kl.sum(-1))
    return torch.cat(rows, dim=1)
