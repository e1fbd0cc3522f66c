"""Parallel PyTorch form of `attention`: dense masked softmax over query chunks.

Used by `backend="reference"` (any device, differentiable by autograd). Queries are processed in
chunks of `chunk` rows so the `[B, H, chunk, Tk]` score block bounds memory at long T.
"""

from __future__ import annotations

import torch

from ..common.attn_utils import compute_dtype, repeat_kv, visible_mask


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, window: int | None = None,
    gate: torch.Tensor | None = None, scale: float | None = None, chunk: int = 1024,
) -> torch.Tensor:  # fmt: skip
    """Masked dense attention; same arguments and result as `attention_naive`.

    Args:
        q (torch.Tensor): `[B, Tq, HQ, K]`.
        k (torch.Tensor): `[B, Tk, HKV, K]`.
        v (torch.Tensor): `[B, Tk, HKV, V]`.
        chunk (int): query rows per score block. Default: `1024`.

    Returns:
        o (torch.Tensor): `[B, Tq, HQ, V]`, dtype of `v`; computed in fp32 (float64 for float64 inputs).
    """
    Tq, HQ, K = q.shape[1:]
    Tk, HKV = k.shape[1:3]
    scale = K**-0.5 if scale is None else scale
    dt = compute_dtype(q, k, v, gate)
    kx, vx = (repeat_kv(x, HQ // HKV).to(dt) for x in (k, v))
    mask = visible_mask(Tq, Tk, causal, window, q.device)
    outs = []
    for i0 in range(0, Tq, chunk):
        s = torch.einsum("bihk,bjhk->bhij", q[:, i0 : i0 + chunk].to(dt) * scale, kx)
        s = s.masked_fill(~mask[i0 : i0 + chunk], float("-inf"))
        outs.append(torch.einsum("bhij,bjhv->bihv", torch.softmax(s, dim=-1), vx))
    o = torch.cat(outs, dim=1) if outs else q.new_zeros(*q.shape[:3], v.shape[-1], dtype=dt)
    if gate is not None:
        g = torch.sigmoid(gate.to(dt))
        o = o * (g if g.dim() == 4 else g[..., None])
    return o.to(v.dtype)
