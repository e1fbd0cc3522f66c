"""`simple_gla`: linear attention with a scalar log decay per head (RetNet, Mamba2/SSD, linear attention).

Math: mixers.md §1, §2, §7. S_t = exp(g_t) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ (s q_t), g `[B, T, HV]`
(None: no decay). Callers map their mixer onto it:
* RetNet: g = log γ_h (constant per head), q/k rotated by the caller.
* Mamba2/SSD: q = C, k = B, v = dt·x, g = dt·A, scale = 1; groups are grouped value heads (q/k have
  G heads, v has H heads); the D skip stays outside the op.
* Linear attention: g = None; for the normalised output append a ones column to v and divide by that
  output column (mixers.md §1(b)).
Files: `naive.py` (recurrent truth), `chunk_ref.py` (chunked PyTorch), `chunk.py` (Triton chunked
forward/backward), `ops.py` (torch.library registration); decode and short gradient-free calls run
the fused recurrent kernel shared with `gla` (decay/recurrent.py).
"""

from __future__ import annotations

import torch
from torch import LongTensor, Tensor

from ..common.backend import check_shape, pick_backend
from ..decay.utils import check_qkv
from ..gla.front import decay_front
from .chunk_ref import chunk_simple_gla_ref
from .naive import naive_recurrent_simple_gla

__all__ = ["chunk_simple_gla_ref", "naive_recurrent_simple_gla", "simple_gla"]


def simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    inplace_final_state: bool = False,
    cu_seqlens: LongTensor | None = None,
    backend: str = "reference",
) -> tuple[Tensor, Tensor | None]:
    """Scalar-decay linear attention with grouped value heads: `gla` with one decay per head.

    Args:
        q, k, v: as in `gla` (queries, keys `[B, T, H, K]`, values `[B, T, HV, V]`).
        g (torch.Tensor, Optional): log decay `[B, T, HV]` (≤ 0, used in fp32). Default: `None` (no decay).
        scale, initial_state, output_final_state, inplace_final_state, cu_seqlens, backend: as in `gla`
            (an in-place final state serves decode without allocation).

    Returns:
        (o, final_state) as in `gla`: o `[B, T, HV, V]` in the dtype of `v`, the final state
        `[N, HV, K, V]` (fp32) or None.
    """
    d = check_qkv(q, k, v, cu_seqlens)
    if g is not None:
        check_shape("g", g, [d.B, d.T, d.HV], "[B, T, HV]")
    if g is None and pick_backend(backend, q) == "triton" and q.is_cuda and q.dtype != torch.float32:
        # The no-decay 16-bit kernels gave o 0.61 relative error on the H200 at small head dims
        # (K=32, V=16, T=100; D=128 was right), where the decayed ones at the same shape were
        # right: a zero decay runs the decayed code, which is the same math.
        g = q.new_zeros(d.B, d.T, d.HV, dtype=torch.float32)
    args = (scale, initial_state, output_final_state, inplace_final_state, cu_seqlens, backend)
    return decay_front("simple_gla", chunk_simple_gla_ref, d, q, k, v, g, *args)
