"""Chunked PyTorch form of scalar-decay linear attention (the `backend="reference"` path).

mixers.md §2(b) with b_r the chunk-local cumulative log decay (resets at every chunk):
O_[c] = (Q ⊙ e^{b}) S + ((Q Kᵀ) ⊙ Γ) V,  Γ_{ri} = e^{b_r − b_i} (r ≥ i),
S ← e^{b_C} S + (K ⊙ e^{b_C − b})ᵀ V. Every exponent is ≤ 0, so nothing overflows.
"""

from __future__ import annotations

import torch


def chunk_simple_gla_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    scale: float,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of equal-length sequences, chunk by chunk.

    Args:
        q (torch.Tensor): `[B, T, H, K]`.
        k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, HV, V]`.
        g (torch.Tensor, Optional): `[B, T, HV]` log decay, or None (no decay).
        scale (float): multiplied into q.
        initial_state (torch.Tensor, Optional): `[B, HV, K, V]`. Default: zeros.
        chunk_size (int, Optional): chunk length C. Default: 64.

    Returns:
        o (torch.Tensor): `[B, T, HV, V]` in the compute dtype (fp32, or float64 for float64 inputs).
        final_state (torch.Tensor): `[B, HV, K, V]`.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dt = torch.float64 if v.dtype == torch.float64 else torch.float32
    # [B, heads, T, *]: heads first so every chunk is a batch of matrices. q and k keep their H
    # heads: the scores QKᵀ are computed once per q/k head and shared by its HV/H value heads
    # (Mamba2's groups), as mixers.md §7(d) counts them.
    q = (q.to(dt) * scale).transpose(1, 2)
    k = k.to(dt).transpose(1, 2)
    v = v.to(dt).transpose(1, 2)
    g = None if g is None else g.to(dt).transpose(1, 2)
    S = q.new_zeros(B, HV, K, V) if initial_state is None else initial_state.to(dt)
    outs = []
    for s in range(0, T, chunk_size):
        e = min(s + chunk_size, T)
        gc = None if g is None else g[:, :, s:e]
        o_c, S = _chunk_step(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], gc, S)
        outs.append(o_c)
    o = torch.cat(outs, dim=2) if outs else v.new_zeros(B, HV, 0, V)
    return o.transpose(1, 2), S


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
