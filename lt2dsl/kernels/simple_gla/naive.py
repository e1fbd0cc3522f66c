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
    """Run the recurrence one token at a time, in float64 when the inputs are float64.

    Args:
        q (torch.Tensor): `[B, T, H, K]`.
        k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, HV, V]`, HV a multiple of H (value head j reads q/k head j // (HV // H)).
        g (torch.Tensor, Optional): `[B, T, HV]` log decay (≤ 0). Default: `None` (no decay).
        scale (float, Optional): multiplied into q. Default: `K ** -0.5`.
        initial_state (torch.Tensor, Optional): `[B, HV, K, V]`. Default: zeros.

    Returns:
        o (torch.Tensor): `[B, T, HV, V]` in the compute dtype (fp32 or float64).
        final_state (torch.Tensor): `[B, HV, K, V]`.
    """
    B, T, _, K = q.shape
    HV = v.shape[2]
    # gla's recurrence with the scalar decay on every key channel (exp(0) = 1 without one)
    g = q.new_zeros(B, T, HV, dtype=torch.float32) if g is None else g
    return naive_recurrent_gla(q, k, v, g[..., None].expand(B, T, HV, K), scale, initial_state)
