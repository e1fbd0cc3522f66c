"""Chunked (WY / UT transform) PyTorch form shared by DeltaNet, GDN and KDA (mixers.md §4–§6).

For one chunk of C tokens with start state S and cumulative log decay b (b_r = Σ_{i≤r} g_i, reset at
the chunk start; a scalar per token for GDN, a K-vector for KDA, zero for DeltaNet), γ = e^b:

1. Akk[r, i] = Σ_c k_rc k_ic e^{b_rc − b_ic} (r > i),  T = (I + Diag(β) Akk)^{-1}
2. U' = T Diag(β) (V − (K ⊙ γ) S)                       (the true per-token innovations)
3. Aqk[r, i] = s Σ_c q_rc k_ic e^{b_rc − b_ic} (r ≥ i),  O = (sQ ⊙ γ) S + Aqk U'
4. S ← Diag(γ_C) S + (K ⊙ e^{b_C − b})ᵀ U'

Every exponent above is ≤ 0 (b is non-increasing), so nothing overflows; KDA's gated products are
formed elementwise over [C, C, K] (clear rather than fast: this is the reference backend).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lt2dsl.kernels.delta.args import expand_heads, seq_bounds, state_dtype


def delta_chunk_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, beta: torch.Tensor, *,
    gate: str, scale: float, initial_state: torch.Tensor | None = None, output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None, chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Chunked delta rule; computed in fp32 (float64 for float64 inputs), differentiable by autograd.

    Args:
        q (Tensor): `[B, T, H, K]`; k likewise.
        v (Tensor): `[B, T, HV, V]`.
        g (Tensor, Optional): log decay, `[B, T, HV]` (gate="scalar") or `[B, T, HV, K]` ("channel").
        beta (Tensor): `[B, T, HV]`.
        gate (str): "none", "scalar" or "channel".
        initial_state (Tensor, Optional): `[N, HV, K, V]`.
        cu_seqlens (LongTensor, Optional): `[N + 1]` (B == 1).
        chunk_size (int, Optional): tokens per chunk.
            Default: `64`.

    Returns:
        o `[B, T, HV, V]` in v's dtype, and the final state `[N, HV, K, V]` (or None).
    """
    B, T, H, K = q.shape
    HV = v.shape[2]
    wd = state_dtype(q)
    q, k = expand_heads(q, HV // H).to(wd) * scale, expand_heads(k, HV // H).to(wd)
    b = _log_decay(g, gate, v, wd)
    out_dtype = v.dtype
    v, beta = v.to(wd), beta.to(wd)
    if cu_seqlens is None:
        S0 = None if initial_state is None else initial_state.to(wd)
        o, S = _chunked(q, k, v, b, beta, S0, chunk_size, gate == "channel")
        return o.to(out_dtype), (S if output_final_state else None)
    outs, finals = [], []
    for n, (_, bos, eos) in enumerate(seq_bounds(cu_seqlens, B, T)):
        S0 = None if initial_state is None else initial_state[n : n + 1].to(wd)
        sl = slice(bos, eos)
        o, S = _chunked(
            q[:, sl], k[:, sl], v[:, sl], b[:, sl], beta[:, sl], S0, chunk_size, gate == "channel"
        )
        outs.append(o)
        finals.append(S)
    o = torch.cat(outs, dim=1)
    return o.to(out_dtype), (torch.cat(finals) if output_final_state else None)


def _log_decay(g: torch.Tensor | None, gate: str, v: torch.Tensor, wd: torch.dtype) -> torch.Tensor:
    """Per-token log decay as `[B, T, HV, K']`: K' = 1 for "none"/"scalar", K for "channel"."""
    if gate == "none":
        return torch.zeros(*v.shape[:3], 1, dtype=wd, device=v.device)
    g = g.to(wd)
    return g[..., None] if gate == "scalar" else g


def _chunked(q, k, v, b, beta, S0, C, per_channel):
    """One batch of equal-length sequences. q, k `[B, T, HV, K]`, v `[B, T, HV, V]`, b `[B, T, HV, K']`."""
    B, T, HV, K = k.shape
    V = v.shape[-1]
    NT = max(1, -(-T // C))
    pad = NT * C - T

    # Zero padding is exact: β = 0 and log decay 0 make a padded step the identity (mixers.md §4 (e)).
    def split(x):
        x = F.pad(x, (0, 0, 0, 0, 0, pad))  # every input here is [B, T, HV, *]
        return x.reshape(B, NT, C, *x.shape[2:]).transpose(2, 3).transpose(1, 2)  # [B, HV, NT, C, .]

    qc, kc, vc, bc = split(q), split(k), split(v), split(b)
    betac = split(beta[..., None])[..., 0]
    bc = bc.cumsum(dim=3)
    S = S0 if S0 is not None else q.new_zeros(B, HV, K, V)
    outs = []
    for c in range(NT):
        o, S = _chunk_step(qc[:, :, c], kc[:, :, c], vc[:, :, c], betac[:, :, c], bc[:, :, c], S, per_channel)
        outs.append(o)
    o = torch.stack(outs, dim=2).permute(0, 2, 3, 1, 4).reshape(B, NT * C, HV, V)[:, :T]
    return o, S


def _chunk_step(q, k, v, beta, b, S, per_channel):
    """Steps 1–4 of the module docstring for one chunk.

    q (already scaled), k `[B, HV, C, K]`; v `[B, HV, C, V]`; beta `[B, HV, C]`; b `[B, HV, C, K']`;
    S `[B, HV, K, V]`. Returns o `[B, HV, C, V]` and the next state.
    """
    Akk, Aqk = _gated_products(q, k, b, per_channel)
    C = k.shape[-2]
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    L = torch.tril(beta[..., None] * Akk, diagonal=-1)
    Tm = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
    gam = b.exp()
    u = Tm @ (beta[..., None] * (v - (k * gam) @ S))
    o = (q * gam) @ S + Aqk @ u
    b_last = b[..., -1:, :]
    S = b_last.exp().transpose(-1, -2) * S + (k * (b_last - b).exp()).transpose(-1, -2) @ u
    return o, S


def _gated_products(q, k, b, per_channel):
    """Akk = (K Kᵀ) ⊙ Γ (strictly lower) and Aqk = (Q Kᵀ) ⊙ Γ (lower with diagonal), `[B, HV, C, C]`.

    Γ[r, i] = e^{b_r − b_i} for r ≥ i; masked entries go through exp(−inf) = 0, never exp(+large).
    """
    C = k.shape[-2]
    lower = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    if not per_channel:
        bs = b[..., 0]
        Gam = torch.where(lower, bs[..., :, None] - bs[..., None, :], float("-inf")).exp()
        return torch.tril(k @ k.transpose(-1, -2) * Gam, -1), q @ k.transpose(-1, -2) * Gam
    diff = b[..., :, None, :] - b[..., None, :, :]  # [B, HV, C, C, K]
    E = torch.where(lower[:, :, None], diff, float("-inf")).exp()
    Akk = torch.einsum("...rc,...ic,...ric->...ri", k, k, E)
    Aqk = torch.einsum("...rc,...ic,...ric->...ri", q, k, E)
    return torch.tril(Akk, -1), Aqk
