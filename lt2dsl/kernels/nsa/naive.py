"""Query-by-query NSA (Native Sparse Attention): the numerical truth for `nsa` (float64-capable).

Three branches per query head, each its own softmax (mixers.md §10):
compressed (attention over block summaries that lie entirely in the past), selected (attention over
the tokens of the top-n blocks chosen per kv head from the compressed probabilities averaged over the
group's query heads, blocks 0 / current / previous always included) and sliding window (§9).
o = g_slc·o_slc + g_cmp·o_cmp + g_swa·o_swa, like the peer's `naive_nsa` (fla `fla/ops/nsa/naive.py`).
"""

from __future__ import annotations

import torch

from ..common.attn_utils import compute_dtype
from .common import NSAGeometry, mean_pool


def _attend(q_h, keys, vals):
    """One head, one query: q_h `[K]` (scaled), keys `[n, K]`, vals `[n, V]` -> `([V], probs [n])`."""
    if keys.shape[0] == 0:
        return vals.new_zeros(vals.shape[-1]), vals.new_zeros(0)
    p = torch.softmax(keys @ q_h, dim=0)
    return p @ vals, p


def _slc_row(p_sum, nsb: int, geo: NSAGeometry):
    """Selection-block scores from the group-averaged compressed probabilities of one query."""
    a, b = geo.sel // geo.stride, geo.cmp // geo.stride
    out = []
    for j in range(nsb):
        terms = [p_sum[a * j - m - u] for m in range(a) for u in range(b) if 0 <= a * j - m - u < len(p_sum)]
        out.append(sum(terms) if terms else p_sum.new_zeros(()))
    return torch.stack(out) if out else p_sum.new_zeros(0)


def _choose_blocks(p_slc, pos: int, n: int, geo: NSAGeometry) -> list[int]:
    """Top-n allowed blocks: forced ones first (lower index first), then by score, ties by index."""
    cur = pos // geo.sel
    forced = sorted({0, cur, cur - 1} - {-1})
    rest = [j for j in range(cur + 1) if j not in forced]
    rest.sort(key=lambda j: (-float(p_slc[j].detach()), j))
    return (forced + rest)[:n]


def nsa_naive(
    q, k, v, g_cmp=None, g_slc=None, g_swa=None, *, block_counts=16, block_size=64, window_size=0,
    scale=None, cmp_block=None, cmp_stride=None, k_cmp=None, v_cmp=None, block_indices=None,
):  # fmt: skip
    """NSA one query at a time. Shapes as in `lt2dsl.kernels.nsa`; returns (o, block_indices).

    o is `[B, Tq, HQ, V]` in v's dtype; block_indices `[B, Tq, HKV, S]` (−1 pads) are the blocks
    used by the selected branch.
    """
    B, Tq, HQ, K = q.shape
    Tk, HKV = k.shape[1:3]
    G, geo = HQ // HKV, NSAGeometry.make(block_size, cmp_block, cmp_stride)
    scale = K**-0.5 if scale is None else scale
    dt = compute_dtype(q, k, v)
    q, k, v = q.to(dt) * scale, k.to(dt), v.to(dt)
    kc = mean_pool(k, geo) if k_cmp is None else k_cmp.to(dt)
    vc = mean_pool(v, geo) if v_cmp is None else v_cmp.to(dt)
    S = block_counts if isinstance(block_counts, int) else int(block_counts.max())
    nsb = geo.n_sel(Tk)
    out_idx = torch.full((B, Tq, HKV, S), -1, dtype=torch.long, device=q.device)
    o_rows = []
    for b in range(B):
        for i in range(Tq):
            pos = i + Tk - Tq
            ncv = sum(1 for c in range(kc.shape[1]) if c * geo.stride + geo.cmp - 1 <= pos)
            heads = []
            for hk in range(HKV):
                o_cmp, probs = zip(
                    *(
                        _attend(q[b, i, h], kc[b, :ncv, hk], vc[b, :ncv, hk])
                        for h in range(hk * G, hk * G + G)
                    )
                )
                if block_indices is None:
                    n = S if isinstance(block_counts, int) else int(block_counts[b, i, hk])
                    p_sum = torch.stack(probs).mean(0) if ncv else kc.new_zeros(0)
                    chosen = _choose_blocks(_slc_row(p_sum, nsb, geo), pos, n, geo)
                    out_idx[b, i, hk, : len(chosen)] = torch.tensor(chosen, dtype=torch.long)
                else:
                    chosen = [int(j) for j in block_indices[b, i, hk] if j >= 0]
                toks = sorted(
                    {j * geo.sel + r for j in set(chosen) for r in range(geo.sel) if j * geo.sel + r <= pos}
                )
                toks = torch.tensor(toks, dtype=torch.long, device=q.device)
                lo = max(0, pos - window_size + 1)
                for g in range(G):
                    h = hk * G + g
                    o_slc = _attend(q[b, i, h], k[b, toks, hk], v[b, toks, hk])[0]
                    res = o_slc if g_slc is None else g_slc[b, i, h].to(dt) * o_slc
                    if g_cmp is not None:
                        res = res + g_cmp[b, i, h].to(dt) * o_cmp[g]
                    if window_size > 0:
                        o_swa = _attend(q[b, i, h], k[b, lo : pos + 1, hk], v[b, lo : pos + 1, hk])[0]
                        res = res + (o_swa if g_swa is None else g_swa[b, i, h].to(dt) * o_swa)
                    heads.append(res)
            o_rows.append(torch.stack(heads))
    o = torch.stack(o_rows).view(B, Tq, HQ, v.shape[-1])
    return o.to(v.dtype), (out_idx if block_indices is None else block_indices)
