"""Token-by-token recurrence of DeltaNet (mixers.md §4 (b)): the numerical truth.

S_t = S_{t−1} + β_t k_t (v_t − S_{t−1}ᵀ k_t)ᵀ = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,
o_t = S_tᵀ (s q_t).
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.delta_args import expand_heads, seq_bounds, state_dtype


def delta_rule_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sequential DeltaNet; float64 inputs are computed in float64, others in fp32.

    Args:
        q (Tensor): `[B, T, H, K]`; k likewise.
        v (Tensor): `[B, T, HV, V]`, HV a multiple of H.
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
        if initial_state is not None:
            S = initial_state[n].to(wd)
        else:
            S = torch.zeros(v.shape[2], k.shape[-1], v.shape[-1], dtype=wd, device=v.device)
        for t in range(bos, eos):
            kt = k[b, t]  # [HV, K]
            u = beta[b, t].to(wd)[:, None] * (v[b, t].to(wd) - torch.einsum("hk,hkv->hv", kt, S))
            S = S + kt[:, :, None] * u[:, None, :]
            o[b, t] = torch.einsum("hk,hkv->hv", q[b, t] * scale, S)
        finals.append(S)
    return o.to(v.dtype), (torch.stack(finals) if output_final_state else None)
