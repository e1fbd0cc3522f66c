"""Token-by-token recurrence of Gated DeltaNet (mixers.md §5 (b)): the numerical truth.

S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   α_t = exp(g_t),   o_t = S_tᵀ (s q_t).
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.delta_args import expand_heads, seq_bounds, state_dtype


def gated_delta_rule_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sequential GDN; float64 inputs are computed in float64, others in fp32.

    Args:
        q (Tensor): `[B, T, H, K]`; k likewise (unit-norm keys keep the recurrence stable).
        v (Tensor): `[B, T, HV, V]`, HV a multiple of H (value head j reads q/k head j // (HV/H)).
        g (Tensor): `[B, T, HV]` log decay (≤ 0).
        beta (Tensor): `[B, T, HV]`.
        scale (float, Optional): multiplied into q.
            Default: `K ** -0.5`.
        initial_state (Tensor, Optional): `[N, HV, K, V]`.
        cu_seqlens (LongTensor, Optional): `[N + 1]` packed sequence bounds (B == 1).

    Returns:
        o `[B, T, HV, V]` in v's dtype, and the final state `[N, HV, K, V]` (or None).
    """
    G = v.shape[2] // q.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    wd = state_dtype(q)
    q, k = expand_heads(q, G).to(wd), expand_heads(k, G).to(wd)
    o = torch.zeros(v.shape, dtype=wd, device=v.device)
    finals = []
    for n, (b, bos, eos) in enumerate(seq_bounds(cu_seqlens, q.shape[0], q.shape[1])):
        S = _start_state(initial_state, n, k, v, wd)
        for t in range(bos, eos):
            S = S * g[b, t].to(wd).exp()[:, None, None]
            kt = k[b, t]  # [HV, K]
            u = beta[b, t].to(wd)[:, None] * (v[b, t].to(wd) - torch.einsum("hk,hkv->hv", kt, S))
            S = S + kt[:, :, None] * u[:, None, :]
            o[b, t] = torch.einsum("hk,hkv->hv", q[b, t] * scale, S)
        finals.append(S)
    return o.to(v.dtype), (torch.stack(finals) if output_final_state else None)


def _start_state(initial_state, n, k, v, wd):
    """`[HV, K, V]` state a sequence starts from (zeros without an initial state)."""
    if initial_state is not None:
        return initial_state[n].to(wd)
    return torch.zeros(v.shape[2], k.shape[-1], v.shape[-1], dtype=wd, device=v.device)
