"""Token-by-token softmax attention: the numerical truth for `attention` (float64-capable).

Each query row is handled on its own: gather the keys its mask lets through, softmax, weighted sum.
Nothing is fused or tiled, so the code is the definition of mixers.md §9 / §12.
"""

from __future__ import annotations

import torch

from ..common.attn_utils import compute_dtype, repeat_kv


def attention_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, window: int | None = None,
    gate: torch.Tensor | None = None, scale: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """Softmax attention, one query at a time.

    Args:
        q (torch.Tensor): `[B, Tq, HQ, K]`; query i sits at position i + Tk − Tq.
        k (torch.Tensor): `[B, Tk, HKV, K]`.
        v (torch.Tensor): `[B, Tk, HKV, V]`.
        causal (bool): key j visible iff j ≤ pos(i). Default: `True`.
        window (int, Optional): also require j ≥ pos(i) − window + 1. Default: `None`.
        gate (torch.Tensor, Optional): pre-sigmoid logits `[B, Tq, HQ, V]` or `[B, Tq, HQ]`.
        scale (float, Optional): default `K ** -0.5`.

    Returns:
        o (torch.Tensor): `[B, Tq, HQ, V]` in the dtype of `v`.
    """
    Tq, HQ, K = q.shape[1:]
    Tk, HKV = k.shape[1:3]
    scale = K**-0.5 if scale is None else scale
    dt = compute_dtype(q, k, v, gate)
    kx, vx = (repeat_kv(x, HQ // HKV).to(dt) for x in (k, v))
    rows = []
    for i in range(Tq):
        pos = i + Tk - Tq
        hi = pos + 1 if causal else Tk
        lo = 0 if window is None else max(0, pos - window + 1)
        s = torch.einsum("bhk,bnhk->bhn", q[:, i].to(dt) * scale, kx[:, lo:hi])
        rows.append(torch.einsum("bhn,bnhv->bhv", torch.softmax(s, dim=-1), vx[:, lo:hi]))
    o = torch.stack(rows, dim=1)
    if gate is not None:
        g = torch.sigmoid(gate.to(dt))
        o = o * (g if g.dim() == 4 else g[..., None])
    return o.to(v.dtype)
