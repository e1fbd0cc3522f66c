"""Token-by-token stabilised mLSTM recurrence: the numerical truth for `mlstm` (mixers.md §8(b)).

logf_t = logσ(f̃_t),  m_t = max(logf_t + m_{t−1}, ĩ_t),
C_t = e^{logf_t + m_{t−1} − m_t} C_{t−1} + e^{ĩ_t − m_t} k_t v_tᵀ,  n_t likewise with k_t,
h_t = C_tᵀ q̃_t / (max(|n_tᵀ q̃_t|, e^{−m_t}) + ε),  q̃ = s q (equivalent to the paper's k / √K).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def naive_recurrent_mlstm(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    i: Tensor,
    f: Tensor,
    scale: float | None = None,
    eps: float = 1e-6,
    initial_state: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """Run the stabilised recurrence one token at a time (float64 when the inputs are float64).

    Args:
        q (torch.Tensor): `[B, T, H, K]`.
        k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, H, V]`.
        i (torch.Tensor): `[B, T, H]` input-gate pre-activation ĩ.
        f (torch.Tensor): `[B, T, H]` forget-gate pre-activation f̃ (logσ applied here).
        scale (float, Optional): multiplied into q. Default: `K ** -0.5`.
        eps (float, Optional): added to the normaliser. Default: 1e-6.
        initial_state (tuple, Optional): (C `[B, H, K, V]`, n `[B, H, K]`, m `[B, H]`). Default: zeros.

    Returns:
        h (torch.Tensor): `[B, T, H, V]` in the compute dtype (fp32 or float64).
        final_state (tuple): (C, n, m) after the last token.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = torch.float64 if v.dtype == torch.float64 else torch.float32
    scale = K**-0.5 if scale is None else scale
    q, k, v = q.to(dt) * scale, k.to(dt), v.to(dt)
    logf, i = F.logsigmoid(f.to(dt)), i.to(dt)
    if initial_state is None:
        C, n, m = q.new_zeros(B, H, K, V), q.new_zeros(B, H, K), q.new_zeros(B, H)
    else:
        C, n, m = (s.to(dt) for s in initial_state)
    h = q.new_empty(B, T, H, V)
    for t in range(T):
        m_new = torch.maximum(logf[:, t] + m, i[:, t])
        i_ = (i[:, t] - m_new).exp()
        f_ = (logf[:, t] + m - m_new).exp()
        C = f_[..., None, None] * C + i_[..., None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
        n = f_[..., None] * n + i_[..., None] * k[:, t]
        m = m_new
        num = torch.einsum("bhk,bhkv->bhv", q[:, t], C)
        den = (n * q[:, t]).sum(-1).abs().maximum((-m).exp()) + eps
        h[:, t] = num / den[..., None]
    return h, (C, n, m)
