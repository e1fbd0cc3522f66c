"""Parallel PyTorch form of `nsa`: dense masked softmax per branch over query chunks.

`backend="reference"`; autograd gives gradients for q, k, v (through the mean pooling too), the gates
and a caller-supplied compression (`k_cmp`, `v_cmp`). The block choice is discrete.
"""

from __future__ import annotations

import torch

from ..common.attn_utils import compute_dtype, repeat_kv, topk_select, visible_mask
from ..dsa.reference import masked_softmax
from .common import (
    NSAGeometry,
    apply_quota,
    block_ranking_inputs,
    cmp_visible,
    mean_pool,
    n_slots,
    slc_scores,
)


def select_blocks(p_cmp, pos, nsb: int, geo: NSAGeometry, block_counts, G: int) -> torch.Tensor:
    """Top-n selection blocks per kv head from compressed probabilities.

    Args:
        p_cmp (torch.Tensor): `[B, HQ, c, NC]` compressed-branch probabilities of a query chunk.
        pos (torch.Tensor): `[c]` absolute query positions.
        block_counts (int or torch.Tensor): n, or `[B, c, HKV]` per-query counts.

    Returns:
        block_indices (torch.LongTensor): `[B, c, HKV, S]`, rank order, −1 pads.
    """
    B, HQ, c, nc = p_cmp.shape
    p_sum = p_cmp.detach().view(B, HQ // G, G, c, nc).mean(2)  # group average, as the peer
    scores, valid = block_ranking_inputs(slc_scores(p_sum, nsb, geo), pos, geo)
    idx = topk_select(scores, valid.expand_as(scores), n_slots(block_counts)).transpose(1, 2)
    return apply_quota(idx, block_counts)


def selected_token_mask(block_indices, pos, Tk: int, geo: NSAGeometry, G: int) -> torch.Tensor:
    """`[B, HQ, c, Tk]`: token in a selected block of the query's kv head and not after the query."""
    B, c, HKV, _ = block_indices.shape
    nsb = geo.n_sel(Tk)
    ok = (block_indices >= 0) & (block_indices < nsb)
    blk = torch.zeros(B, c, HKV, nsb + 1, dtype=torch.bool, device=pos.device)
    blk.scatter_(-1, torch.where(ok, block_indices, nsb), True)
    tok = torch.arange(Tk, device=pos.device)
    m = blk[..., tok // geo.sel] & (tok[None, :] <= pos[:, None])[None, :, None, :]
    return m.repeat_interleave(G, dim=2).permute(0, 2, 1, 3)


def masked_attention(qc, kx, vx, mask):
    """Softmax attention of each NSA branch under its boolean mask, and its probabilities (the block
    scores): qc `[B, c, HQ, K]`, kx/vx `[B, n, HQ, *]`, mask `[B|1, HQ|1, c, n]`; returns
    (o `[B, c, HQ, V]`, p `[B, HQ, c, n]`)."""
    p = masked_softmax(torch.einsum("bihk,bjhk->bhij", qc, kx), mask)
    return torch.einsum("bhij,bjhv->bihv", p, vx), p


def nsa_reference(
    q, k, v, g_cmp=None, g_slc=None, g_swa=None, *, block_counts=16, block_size=64, window_size=0,
    scale=None, cmp_block=None, cmp_stride=None, k_cmp=None, v_cmp=None, block_indices=None, chunk: int = 256,
):  # fmt: skip
    """Vectorised `nsa_naive`; returns (o `[B, Tq, HQ, V]` in v's dtype, block_indices `[B, Tq, HKV, S]`)."""
    B, Tq, HQ, K = q.shape
    Tk, HKV = k.shape[1:3]
    G, geo = HQ // HKV, NSAGeometry.make(block_size, cmp_block, cmp_stride)
    scale = K**-0.5 if scale is None else scale
    dt = compute_dtype(q, k, v)
    kc = mean_pool(k, geo) if k_cmp is None else k_cmp
    vc = mean_pool(v, geo) if v_cmp is None else v_cmp
    kx, vx, kcx, vcx = (repeat_kv(x.to(dt), G) for x in (k, v, kc, vc))
    outs, idxs = [], []
    for i0 in range(0, Tq, chunk):
        qc = q[:, i0 : i0 + chunk].to(dt) * scale
        pos = torch.arange(i0, i0 + qc.shape[1], device=q.device) + (Tk - Tq)
        o_cmp, p_cmp = masked_attention(qc, kcx, vcx, cmp_visible(pos, kc.shape[1], geo)[None, None])
        if block_indices is None:
            counts = block_counts if isinstance(block_counts, int) else block_counts[:, i0 : i0 + chunk]
            bi = select_blocks(p_cmp, pos, geo.n_sel(Tk), geo, counts, G)
        else:
            bi = block_indices[:, i0 : i0 + chunk]
        o = masked_attention(qc, kx, vx, selected_token_mask(bi, pos, Tk, geo, G))[0]
        o = _gated(o, g_slc, i0, dt)
        if g_cmp is not None:
            o = o + _gated(o_cmp, g_cmp, i0, dt)
        if window_size > 0:
            mask = visible_mask(Tq, Tk, True, window_size, q.device)[i0 : i0 + chunk]
            o = o + _gated(masked_attention(qc, kx, vx, mask[None, None])[0], g_swa, i0, dt)
        outs.append(o)
        idxs.append(bi)
    o = torch.cat(outs, dim=1).to(v.dtype)
    return o, torch.cat(idxs, dim=1)


def _gated(o, g, i0: int, dt):
    """g[..., None] · o for the chunk starting at i0 (None: weight 1)."""
    return o if g is None else o * g[:, i0 : i0 + o.shape[1]].to(dt)[..., None]
