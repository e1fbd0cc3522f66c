"""Token-by-token recurrence of scalar-decay linear attention: the numerical truth for `simple_gla`.

mixers.md §2(b) / §7(b) / §1(b) with a per-head scalar log decay g_t (g = None: no decay):
S_t = exp(g_t) S_{t−1} + k_t v_tᵀ,  o_t = S_tᵀ (s q_t).
"""

from __future__ import annotations

import torch

from ..gla.naive import naive_recurrent_gla


def naive_recurrent_simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`naive_recurrent_gla` (same arguments, shapes and returns) with the scalar log decay g
    `[B, T, HV]` (≤ 0; None: no decay) on every key channel."""
    B, T, _, K = q.shape
    HV = v.shape[2]
    # gla's recurrence with the scalar decay on every key channel (exp(0) = 1 without one)
    g = q.new_zeros(B, T, HV, dtype=torch.float32) if g is None else g
    return naive_recurrent_gla(q, k, v, g[..., None].expand(B, T, HV, K), scale, initial_state)
