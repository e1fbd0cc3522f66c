"""Chunked PyTorch form of scalar-decay linear attention (the `backend="reference"` path).

mixers.md §2(b) with b_r the chunk-local cumulative log decay (resets at every chunk):
O_[c] = (Q ⊙ e^{b}) S + ((Q Kᵀ) ⊙ Γ) V,  Γ_{ri} = e^{b_r − b_i} (r ≥ i),
S ← e^{b_C} S + (K ⊙ e^{b_C − b})ᵀ V. Every exponent is ≤ 0, so nothing overflows.
"""

from __future__ import annotations

import torch

from ..gla.chunk_ref import chunk_scan


def chunk_simple_gla_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    scale: float,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_gla_ref` (same arguments, shapes and returns) with the scalar log decay g `[B, T, HV]`
    (None: no decay)."""
    dt = torch.float64 if v.dtype == torch.float64 else torch.float32
    # [B, heads, T, *]: heads first so every chunk is a batch of matrices. q and k keep their H
    # heads: the scores QKᵀ are computed once per q/k head and shared by its HV/H value heads
    # (Mamba2's groups), as mixers.md §7(d) counts them.
    q = (q.to(dt) * scale).transpose(1, 2)
    k = k.to(dt).transpose(1, 2)
    v = v.to(dt).transpose(1, 2)
    g = None if g is None else g.to(dt).transpose(1, 2)
    return chunk_scan(_chunk_step, q, k, v, g, initial_state, chunk_size)


def _chunk_step(qc, kc, vc, gc, S):
    """One chunk: qc, kc `[B, H, C, K]`, vc `[B, HV, C, V]`, gc `[B, HV, C]` or None, S `[B, HV, K, V]`."""
    C, G = qc.shape[2], vc.shape[1] // qc.shape[1]
    mask = torch.ones(C, C, dtype=torch.bool, device=qc.device).tril()
    scores = (qc @ kc.transpose(-1, -2)).repeat_interleave(G, dim=1)
    qc, kc = qc.repeat_interleave(G, dim=1), kc.repeat_interleave(G, dim=1)
    if gc is None:
        return (qc @ S) + (scores * mask) @ vc, S + kc.transpose(-1, -2) @ vc
    b = gc.cumsum(-1)
    # mask the exponent (not the result) so e^{b_r − b_i} for r < i never overflows
    expo = torch.where(mask, b[..., :, None] - b[..., None, :], float("-inf"))
    o = (qc * b.exp()[..., None]) @ S + (scores * expo.exp()) @ vc
    b_last = b[..., -1:]
    S = S * b_last.exp()[..., None] + (kc * (b_last - b).exp()[..., None]).transpose(-1, -2) @ vc
    return o, S
