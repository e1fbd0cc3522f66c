"""Token-by-token recurrence of gated linear attention: the numerical truth for `gla`.

mixers.md §3(b): S_t = Diag(exp(g_t)) S_{t−1} + k_t v_tᵀ,  o_t = S_tᵀ (s q_t), g_t ∈ R^K per value head.
"""

from __future__ import annotations

import torch
from torch import Tensor


def naive_recurrent_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Run the recurrence one token at a time, in float64 when the inputs are float64.

    Args:
        q (torch.Tensor): `[B, T, H, K]`.
        k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, HV, V]`, HV a multiple of H.
        g (torch.Tensor): `[B, T, HV, K]` per-channel log decay (≤ 0).
        scale (float, Optional): multiplied into q. Default: `K ** -0.5`.
        initial_state (torch.Tensor, Optional): `[B, HV, K, V]`. Default: zeros.

    Returns:
        o (torch.Tensor): `[B, T, HV, V]` in the compute dtype (fp32 or float64).
        final_state (torch.Tensor): `[B, HV, K, V]`.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dt = torch.float64 if v.dtype == torch.float64 else torch.float32
    scale = K**-0.5 if scale is None else scale
    q = q.to(dt).repeat_interleave(HV // H, dim=2) * scale
    k = k.to(dt).repeat_interleave(HV // H, dim=2)
    v, g = v.to(dt), g.to(dt)
    S = q.new_zeros(B, HV, K, V) if initial_state is None else initial_state.to(dt).clone()
    o = q.new_empty(B, T, HV, V)
    for t in range(T):
        S = S * g[:, t].exp()[..., None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, S
