"""Token-by-token recurrences of the delta-rule family: the numerical truth every test compares with.

    DeltaNet (mixers.md §4 (b)):  S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ
    GDN      (§5 (b)):            S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   α_t = e^{g_t}
    KDA      (§6 (b)):            S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} + β_t k_t v_tᵀ,   α_t ∈ (0, 1]^K

and o_t = S_tᵀ (s q_t). The decay acts on S before the delta correction, written as
S_t = S' + β_t k_t (v_t − S'ᵀ k_t)ᵀ with S' the decayed S_{t−1}.
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.delta.args import expand_heads, seq_bounds, state_dtype

Tensor = torch.Tensor


def delta_naive(
    gate: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Sequential delta rule; float64 inputs are computed in float64, others in fp32.

    Args:
        gate (str): "none" (DeltaNet), "scalar" (GDN, g `[B, T, HV]`) or "channel" (KDA, g
            `[B, T, HV, K]`); g holds log decays (≤ 0) and is ignored without a gate.
        q (Tensor): `[B, T, H, K]`; k likewise (unit-norm keys keep the recurrence stable).
        v (Tensor): `[B, T, HV, V]`, HV a multiple of H (value head j reads q/k head j // (HV/H)).
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
            if gate == "scalar":
                S = S * g[b, t].to(wd).exp()[:, None, None]
            elif gate == "channel":
                S = S * g[b, t].to(wd).exp()[:, :, None]
            kt = k[b, t]  # [HV, K]
            u = beta[b, t].to(wd)[:, None] * (v[b, t].to(wd) - torch.einsum("hk,hkv->hv", kt, S))
            S = S + kt[:, :, None] * u[:, None, :]
            o[b, t] = torch.einsum("hk,hkv->hv", q[b, t] * scale, S)
        finals.append(S)
    return o.to(v.dtype), (torch.stack(finals) if output_final_state else None)


def delta_rule_naive(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, **kw) -> tuple[Tensor, Tensor | None]:
    """Sequential DeltaNet (`delta_naive` without a gate)."""
    return delta_naive("none", q, k, v, None, beta, **kw)


def gated_delta_rule_naive(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, **kw
) -> tuple[Tensor, Tensor | None]:
    """Sequential GDN (`delta_naive` with g `[B, T, HV]`)."""
    return delta_naive("scalar", q, k, v, g, beta, **kw)


def kda_naive(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, **kw) -> tuple[Tensor, Tensor | None]:
    """Sequential KDA (`delta_naive` with g `[B, T, HV, K]`)."""
    return delta_naive("channel", q, k, v, g, beta, **kw)
