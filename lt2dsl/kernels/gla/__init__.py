"""`gla`: gated linear attention with a per-channel log decay (mixers.md §3).

S_t = Diag(exp(g_t)) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ (s q_t), g `[B, T, HV, K]` (≤ 0, fp32).
Files: `naive.py` (recurrent truth), `chunk_ref.py` (chunked PyTorch with 16-token sub-chunks),
`chunk.py` (Triton chunked forward/backward), `ops.py` (torch.library registration); decode runs
the fused recurrent kernel shared with `simple_gla` (decay/recurrent.py).
"""

from __future__ import annotations

import torch

from ..common.backend import check_shape
from ..decay.utils import check_qkv
from .chunk_ref import chunk_gla_ref
from .front import decay_front
from .naive import naive_recurrent_gla

__all__ = ["chunk_gla_ref", "gla", "naive_recurrent_gla"]


def gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    inplace_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    backend: str = "reference",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated linear attention with grouped value heads.

    Args:
        q (torch.Tensor): queries `[B, T, H, K]`.
        k (torch.Tensor): keys `[B, T, H, K]`.
        v (torch.Tensor): values `[B, T, HV, V]`; value head j reads q/k head j // (HV // H).
        g (torch.Tensor): per-channel log decay `[B, T, HV, K]` (≤ 0, used in fp32).
        scale (float, Optional): multiplied into q. Default: `K ** -0.5`.
        initial_state (torch.Tensor, Optional): `[N, HV, K, V]`. Default: zeros.
        output_final_state (bool, Optional): return the final state `[N, HV, K, V]` (fp32). Default: `False`.
        inplace_final_state (bool, Optional): write the final state into `initial_state` and return
            that tensor. Default: `False`.
        cu_seqlens (torch.LongTensor, Optional): `[N + 1]` packed sequence starts (B == 1). Default: `None`.
        backend (str, Optional): "reference", "triton" or "auto". Default: "reference".

    Returns:
        o (torch.Tensor): `[B, T, HV, V]` in the dtype of `v`.
        final_state (torch.Tensor or None): `[N, HV, K, V]`, or None when not asked for.
    """
    d = check_qkv(q, k, v, cu_seqlens)
    check_shape("g", g, [d.B, d.T, d.HV, d.K], "[B, T, HV, K]")
    args = (scale, initial_state, output_final_state, inplace_final_state, cu_seqlens, backend)
    return decay_front("gla", chunk_gla_ref, d, q, k, v, g, *args)
