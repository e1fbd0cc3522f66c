"""The lightning indexer's KL alignment loss (mixers.md §11(b)), for training code.

Dense warm-up: L = Σ_t KL(p_t ‖ softmax(I[t, :])) over causal keys, where p_t is the main attention's
probability summed over heads and L1-normalised. Sparse stage (`indices` given): both distributions
are restricted to the selected keys S_t. The main attention is a fixed target: q and k are detached,
so the loss trains only the indexer (q_idx, k_idx, w_idx).
"""

from __future__ import annotations

import torch

from ..common.attn_utils import compute_dtype, repeat_kv
from .reference import causal_keys, indexer_scores, masked_softmax, selection_mask


def dsa_indexer_kl(
    q: torch.Tensor,
    k: torch.Tensor,
    q_idx: torch.Tensor,
    k_idx: torch.Tensor,
    w_idx: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    idx_scale: float | None = None,
    indices: torch.LongTensor | None = None,
    reduction: str = "sum",
    chunk: int = 256,
) -> torch.Tensor:
    """KL(p_t ‖ softmax(I_t)) of the indexer against the main attention, summed over heads.

    Args:
        q (torch.Tensor): main queries `[B, Tq, HQ, K]` (detached here).
        k (torch.Tensor): main keys `[B, Tk, HKV, K]` (detached here).
        q_idx (torch.Tensor): index queries `[B, Tq, HI, DI]`.
        k_idx (torch.Tensor): index keys `[B, Tk, DI]`.
        w_idx (torch.Tensor, Optional): head weights `[B, Tq, HI]`; None: all ones.
        scale (float, Optional): main attention scale; default `K ** -0.5`.
        idx_scale (float, Optional): factor inside the ReLU of the index score; default
            `(HI · DI) ** -0.5` as in mixers.md §11(b). The softmax is not scale-invariant, unlike the
            top-k, so this is the sheet's value rather than the `dsa` op's selection default `DI ** -0.5`;
            pass `DI ** -0.5` when `w_idx` already carries the `HI ** -0.5` factor.
        indices (torch.LongTensor, Optional): `[B, Tq, topk]` selection of the sparse stage.
        reduction (str, Optional): "sum" (Σ over queries and batch), "mean" or "none" (`[B, Tq]`).

    Returns:
        loss (torch.Tensor): scalar (or `[B, Tq]`), float32 (float64 for float64 inputs).
    """
    B, Tq, HQ, K = q.shape
    Tk, HKV = k.shape[1:3]
    HI, DI = q_idx.shape[2:]
    scale = K**-0.5 if scale is None else scale
    idx_scale = (HI * DI) ** -0.5 if idx_scale is None else idx_scale
    dt = compute_dtype(q, k, q_idx, k_idx, w_idx)
    kx = repeat_kv(k.detach(), HQ // HKV).to(dt)
    rows = []
    for i0 in range(0, Tq, chunk):
        c = min(chunk, Tq - i0)
        if indices is None:
            mask = causal_keys(i0, c, Tq, Tk, q.device).expand(B, c, Tk)
        else:
            mask = selection_mask(indices[:, i0 : i0 + c], i0, Tq, Tk)
        target = _head_summed_probs(q.detach()[:, i0 : i0 + c].to(dt) * scale, kx, mask)
        w = None if w_idx is None else w_idx[:, i0 : i0 + c]
        logits = indexer_scores(q_idx[:, i0 : i0 + c], k_idx, w, idx_scale, dt)
        logq = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        kl = torch.where(target > 0, target * (torch.log(target.clamp_min(1e-300)) - logq), 0.0)
        rows.append(kl.sum(-1))
    per_query = torch.cat(rows, dim=1)
    if reduction == "none":
        return per_query
    return per_query.sum() if reduction == "sum" else per_query.mean()


def _head_summed_probs(qs, kx, mask) -> torch.Tensor:
    """Main attention probabilities summed over heads, L1-normalised: `[B, c, Tk]`."""
    s = torch.einsum("bihk,bjhk->bhij", qs, kx)
    p = masked_softmax(s, mask[:, None]).sum(1)
    return p / p.sum(-1, keepdim=True).clamp_min(1e-30)
