"""Chunked PyTorch form of the stabilised mLSTM (the `backend="reference"` path; mixers.md §8(b)).

Per chunk with carried (C, n, m) and chunk-local cumulative log-forget b_r:
stab_r = max(b_r + m, max_{j≤r}(b_r − b_j + ĩ_j)) (this is exactly the recurrent m_r),
num_r = e^{b_r + m − stab_r} q_rᵀ C + Σ_{j≤r} e^{b_r − b_j + ĩ_j − stab_r} (q_r·k_j) v_j, den_r likewise
with n and 1, h_r = num_r / (max(|den_r|, e^{−stab_r}) + ε);
state: a_j = ĩ_j + b_C − b_j, m' = max(b_C + m, max_j a_j),
C ← e^{b_C + m − m'} C + Σ_j e^{a_j − m'} k_j v_jᵀ (n likewise), m ← m'. All exponents are ≤ 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunk_mlstm_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    scale: float,
    eps: float,
    initial_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One batch of equal-length sequences, chunk by chunk.

    Args:
        q (torch.Tensor): `[B, T, H, K]`.
        k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, H, V]`.
        i (torch.Tensor): `[B, T, H]` input-gate pre-activation.
        f (torch.Tensor): `[B, T, H]` forget-gate pre-activation.
        scale (float): multiplied into q.
        eps (float): added to the normaliser.
        initial_state (tuple, Optional): (C `[B, H, K, V]`, n `[B, H, K]`, m `[B, H]`). Default: zeros.
        chunk_size (int, Optional): chunk length. Default: 64.

    Returns:
        h (torch.Tensor): `[B, T, H, V]` in the compute dtype.
        final_state (tuple): (C, n, m).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = torch.float64 if v.dtype == torch.float64 else torch.float32
    q = (q.to(dt) * scale).transpose(1, 2)
    k, v = k.to(dt).transpose(1, 2), v.to(dt).transpose(1, 2)
    logf, i = F.logsigmoid(f.to(dt)).transpose(1, 2), i.to(dt).transpose(1, 2)
    if initial_state is None:
        state = (q.new_zeros(B, H, K, V), q.new_zeros(B, H, K), q.new_zeros(B, H))
    else:
        state = tuple(s.to(dt) for s in initial_state)
    outs = []
    for s in range(0, T, chunk_size):
        e = min(s + chunk_size, T)
        h_c = _chunk_out(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], i[:, :, s:e], logf[:, :, s:e], state, eps)
        state = _chunk_state(k[:, :, s:e], v[:, :, s:e], i[:, :, s:e], logf[:, :, s:e], state)
        outs.append(h_c)
    h = torch.cat(outs, dim=2) if outs else v.new_zeros(B, H, 0, V)
    return h.transpose(1, 2), state


def _chunk_out(qc, kc, vc, ic, lfc, state, eps):
    """Outputs of one chunk: qc, kc `[B, H, C, K]`, vc `[B, H, C, V]`, ic, lfc `[B, H, C]`."""
    C_, n_, m_ = state
    L = qc.shape[2]
    b = lfc.cumsum(-1)
    mask = torch.ones(L, L, dtype=torch.bool, device=qc.device).tril()
    logD = torch.where(mask, b[..., :, None] - b[..., None, :] + ic[..., None, :], float("-inf"))
    stab = torch.maximum(b + m_[..., None], logD.max(-1).values)  # [B, H, C]
    w_state = (b + m_[..., None] - stab).exp()
    P = (qc @ kc.transpose(-1, -2)) * (logD - stab[..., None]).exp()
    num = w_state[..., None] * (qc @ C_) + P @ vc
    den = w_state * (qc @ n_[..., None])[..., 0] + P.sum(-1)
    return num / (den.abs().maximum((-stab).exp()) + eps)[..., None]


def _chunk_state(kc, vc, ic, lfc, state):
    """Carry (C, n, m) over one chunk."""
    C_, n_, m_ = state
    b = lfc.cumsum(-1)
    b_last = b[..., -1]
    a = ic + b_last[..., None] - b
    m_new = torch.maximum(b_last + m_, a.max(-1).values)
    decay = (b_last + m_ - m_new).exp()
    w = (a - m_new[..., None]).exp()
    C_ = decay[..., None, None] * C_ + (kc * w[..., None]).transpose(-1, -2) @ vc
    n_ = decay[..., None] * n_ + (kc * w[..., None]).sum(-2)
    return C_, n_, m_new
