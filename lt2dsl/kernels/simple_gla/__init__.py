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

from ..common.backend import check_shape, pick_backend
from ..decay.utils import check_qkv
from ..gla.front import decay_front
from .chunk_ref import chunk_simple_gla_ref
from .naive import naive_recurrent_simple_gla

__all__ = ["chunk_simple_gla_ref", "naive_recurrent_simple_gla", "simple_gla"]


def _chunk_op():
    """`lt2dsl::simple_gla_chunk_fwd`, imported on first use: the reference path needs no Triton."""
    from . import ops  # noqa: F401  (registers the op)

    return torch.ops.lt2dsl.simple_gla_chunk_fwd


def simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    inplace_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    backend: str = "reference",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scalar-decay linear attention with grouped value heads.

    Args:
        q (torch.Tensor): queries `[B, T, H, K]`.
        k (torch.Tensor): keys `[B, T, H, K]`.
        v (torch.Tensor): values `[B, T, HV, V]`; value head j reads q/k head j // (HV // H).
        g (torch.Tensor, Optional): log decay `[B, T, HV]` (≤ 0, used in fp32). Default: `None` (no decay).
        scale (float, Optional): multiplied into q. Default: `K ** -0.5`.
        initial_state (torch.Tensor, Optional): `[N, HV, K, V]`. Default: zeros.
        output_final_state (bool, Optional): return the final state `[N, HV, K, V]` (fp32). Default: `False`.
        inplace_final_state (bool, Optional): write the final state into `initial_state` and return
            that tensor (decode without allocation). Default: `False`.
        cu_seqlens (torch.LongTensor, Optional): `[N + 1]` packed sequence starts (B == 1). Default: `None`.
        backend (str, Optional): "reference", "triton" or "auto". Default: "reference".

    Returns:
        o (torch.Tensor): `[B, T, HV, V]` in the dtype of `v`.
        final_state (torch.Tensor or None): `[N, HV, K, V]`, or None when not asked for.
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
    return decay_front(_chunk_op, chunk_simple_gla_ref, d, q, k, v, g, *args)
