"""Chunked PyTorch form of GLA with secondary sub-chunking (the `backend="reference"` path).

mixers.md §3(b, e). Per chunk with chunk-local cumulative log decay b_r ∈ R^K:
O = (Q ⊙ e^{b}) S + A V,  A_{ri} = s Σ_c q_{rc} k_{ic} e^{b_{rc} − b_{ic}} (i ≤ r),
S ← Diag(e^{b_C}) S + (K ⊙ e^{b_C − b})ᵀ V.
K ⊙ e^{−b} would overflow for strong decays, so A is built from sub-chunks of 16: an off-diagonal
block (query sub-chunk i after key sub-chunk j) is (Q_i ⊙ e^{b_i − b_n})(K_j ⊙ e^{b_n − b_j})ᵀ with b_n the
decay at the first row of sub-chunk i (both exponents ≤ 0); diagonal blocks are elementwise.
The Triton kernels use the same decomposition.
"""

from __future__ import annotations

import torch

SUB = 16


def chunk_gla_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of equal-length sequences, chunk by chunk.

    Args:
        q (torch.Tensor): `[B, T, H, K]`.
        k (torch.Tensor): `[B, T, H, K]`.
        v (torch.Tensor): `[B, T, HV, V]`.
        g (torch.Tensor): `[B, T, HV, K]` per-channel log decay.
        scale (float): multiplied into q.
        initial_state (torch.Tensor, Optional): `[B, HV, K, V]`. Default: zeros.
        chunk_size (int, Optional): chunk length C. Default: 64.

    Returns:
        o (torch.Tensor): `[B, T, HV, V]` in the compute dtype (fp32, or float64 for float64 inputs).
        final_state (torch.Tensor): `[B, HV, K, V]`.
    """
    H, HV = q.shape[2], v.shape[2]
    dt = torch.float64 if v.dtype == torch.float64 else torch.float32
    q = (q.to(dt) * scale).repeat_interleave(HV // H, dim=2).transpose(1, 2)
    k = k.to(dt).repeat_interleave(HV // H, dim=2).transpose(1, 2)
    v, g = v.to(dt).transpose(1, 2), g.to(dt).transpose(1, 2)
    return chunk_scan(_chunk_step, q, k, v, g, initial_state, chunk_size)


def chunk_scan(step, q, k, v, g, initial_state, chunk_size: int):
    """(o `[B, T, HV, V]`, final state `[B, HV, K, V]`) of `step(qc, kc, vc, gc, S) -> (o_c, S)` run
    over the chunks of q, k `[B, heads, T, K]`, v `[B, HV, T, V]` and g `[B, HV, T, ...]` (None: none),
    all in the compute dtype, from `initial_state` (None: zeros)."""
    B, HV, T, V = v.shape
    S = q.new_zeros(B, HV, q.shape[-1], V) if initial_state is None else initial_state.to(q.dtype)
    outs = []
    for s in range(0, T, chunk_size):
        e = min(s + chunk_size, T)
        gc = None if g is None else g[:, :, s:e]
        o_c, S = step(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], gc, S)
        outs.append(o_c)
    o = torch.cat(outs, dim=2) if outs else v.new_zeros(B, HV, 0, V)
    return o.transpose(1, 2), S


def _chunk_step(qc, kc, vc, gc, S):
    """One chunk: qc, kc, gc `[B, HV, C, K]`, vc `[B, HV, C, V]`, S `[B, HV, K, V]`."""
    b = gc.cumsum(2)
    A = intra_scores(qc, kc, b)
    o = (qc * b.exp()) @ S + A @ vc
    b_last = b[:, :, -1:]
    S = S * b_last.exp().transpose(-1, -2) + (kc * (b_last - b).exp()).transpose(-1, -2) @ vc
    return o, S


def intra_scores(qc: torch.Tensor, kc: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A `[B, HV, C, C]` (lower triangular incl. diagonal) from q, k, cumulative decay b `[B, HV, C, K]`."""
    C = qc.shape[2]
    A = qc.new_zeros(*qc.shape[:2], C, C)
    for i0 in range(0, C, SUB):
        i1 = min(i0 + SUB, C)
        b_n = b[:, :, i0 : i0 + 1]  # reference point: first row of the query sub-chunk
        q_i = qc[:, :, i0:i1] * (b[:, :, i0:i1] - b_n).exp()
        if i0 > 0:
            k_j = kc[:, :, :i0] * (b_n - b[:, :, :i0]).exp()
            A[:, :, i0:i1, :i0] = q_i @ k_j.transpose(-1, -2)
        A[:, :, i0:i1, i0:i1] = _diag_block(qc[:, :, i0:i1], kc[:, :, i0:i1], b[:, :, i0:i1])
    return A


def _diag_block(q, k, b):
    """Elementwise Σ_c q_rc k_ic e^{b_rc − b_ic} for i ≤ r on one sub-chunk (`[B, HV, c, K]` inputs)."""
    n = q.shape[2]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    expo = b[:, :, :, None, :] - b[:, :, None, :, :]
    expo = torch.where(mask[:, :, None], expo, float("-inf"))
    return torch.einsum("bhrc,bhic,bhric->bhri", q, k, expo.exp())
