"""`mlstm`: xLSTM's matrix-memory LSTM cell with exponential input gate and max stabiliser (mixers.md §8).

State (C `[N, H, K, V]`, n `[N, H, K]`, m `[N, H]`), all fp32. Gates are raw pre-activations:
logσ(f̃) is taken inside, ĩ enters as e^{ĩ}. Files: `naive.py` (recurrent truth), `chunk_ref.py`
(chunked PyTorch), `chunk.py` / `chunk_bwd.py` (Triton chunked forward / backward),
`stabiliser.py` (the gradient through the max stabiliser), `fused_recurrent.py` (Triton decode),
`ops.py` (torch.library registration).
"""

from __future__ import annotations

import torch

from ..common.backend import check_shape, pick_backend
from ..decay.utils import check_inplace, check_qkv, check_state, run_by_sequence, write_final_state
from .chunk_ref import chunk_mlstm_ref
from .naive import naive_recurrent_mlstm

__all__ = ["chunk_mlstm_ref", "mlstm", "naive_recurrent_mlstm"]

MLSTMState = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def mlstm(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    scale: float | None = None,
    eps: float = 1e-6,
    initial_state: MLSTMState | None = None,
    output_final_state: bool = False,
    inplace_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    backend: str = "reference",
) -> tuple[torch.Tensor, MLSTMState | None]:
    """Stabilised mLSTM cell, h_t = C_tᵀ q̃_t / (max(|n_tᵀ q̃_t|, e^{−m_t}) + ε).

    Args:
        q (torch.Tensor): queries `[B, T, H, K]`.
        k (torch.Tensor): keys `[B, T, H, K]`.
        v (torch.Tensor): values `[B, T, H, V]`.
        i (torch.Tensor): input-gate pre-activations `[B, T, H]` (used in fp32).
        f (torch.Tensor): forget-gate pre-activations `[B, T, H]` (logσ taken inside, fp32).
        scale (float, Optional): multiplied into q (the paper's k / √K). Default: `K ** -0.5`.
        eps (float, Optional): added to the normaliser. Default: 1e-6.
        initial_state (tuple, Optional): (C `[N, H, K, V]`, n `[N, H, K]`, m `[N, H]`). Default: zeros.
        output_final_state (bool, Optional): return the final (C, n, m) in fp32. Default: `False`.
        inplace_final_state (bool, Optional): write the final state into the `initial_state`
            tensors and return them. Default: `False`.
        cu_seqlens (torch.LongTensor, Optional): `[N + 1]` packed sequence starts (B == 1). Default: `None`.
        backend (str, Optional): "reference", "triton" or "auto". Default: "reference".

    Returns:
        h (torch.Tensor): `[B, T, H, V]` in the dtype of `v`.
        final_state (tuple or None): (C, n, m), or None when not asked for.
    """
    d = check_qkv(q, k, v, cu_seqlens)
    initial_state = tuple(initial_state) if isinstance(initial_state, list) else initial_state
    if d.HV != d.H:
        raise ValueError(f"mlstm needs v as [B, T, H, V] with the q/k heads H={d.H}, got HV={d.HV}")
    check_shape("i", i, [d.B, d.T, d.H], "[B, T, H]")
    check_shape("f", f, [d.B, d.T, d.H], "[B, T, H]")
    _check_mlstm_state(initial_state, d)
    check_inplace(inplace_final_state, initial_state)
    scale = d.K**-0.5 if scale is None else float(scale)
    want_final = output_final_state or inplace_final_state
    if pick_backend(backend, q) == "triton":
        from .ops import mlstm_triton

        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, i, f))
        if needs_grad and q.is_cuda and q.dtype != torch.float32 and min(d.K, d.V) < 32:
            # The 16-bit backward gave 0.68 relative error on the H200 with 16-wide head dims
            # (K=32, V=16; D=64 and 128 were right): such calls train through the fp32 kernels.
            h, final = mlstm_triton(
                q.float(), k.float(), v.float(), i, f, scale, float(eps), initial_state, want_final,
                inplace_final_state, cu_seqlens,
            )  # fmt: skip
            return h.to(v.dtype), final
        h, final = mlstm_triton(
            q, k, v, i, f, scale, float(eps), initial_state, want_final, inplace_final_state, cu_seqlens
        )
        return h, final

    def run(q_, k_, v_, i_, f_, s0):  # the chunked PyTorch form of one batch of equal-length sequences
        return chunk_mlstm_ref(q_, k_, v_, i_, f_, scale, float(eps), s0)

    h, final = run_by_sequence(run, cu_seqlens, [q, k, v, i, f], initial_state)
    final = write_final_state(final, initial_state, inplace_final_state) if want_final else None
    return h.to(v.dtype), final


def _check_mlstm_state(state, d) -> None:
    """(C `[N, H, K, V]`, n `[N, H, K]`, m `[N, H]`) or None."""
    if state is None:
        return
    if not isinstance(state, tuple | list) or len(state) != 3:
        raise ValueError("`initial_state` must be a tuple (C [N, H, K, V], n [N, H, K], m [N, H])")
    C, n, m = state
    check_state("initial_state[0] (C)", C, [d.N, d.H, d.K, d.V], "[N, H, K, V]")
    check_state("initial_state[1] (n)", n, [d.N, d.H, d.K], "[N, H, K]")
    check_state("initial_state[2] (m)", m, [d.N, d.H], "[N, H]")
