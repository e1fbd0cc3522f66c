"""DeltaNet core: S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ (mixers.md §4).

`naive.py` is the recurrent truth; the chunked PyTorch form is `common/delta_chunk_ref.py` and the
Triton kernels are shared with GDN in `common/delta_*` (compiled without the gate).
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.delta_ops import run_delta

__all__ = ["delta_rule"]


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    inplace_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    backend: str = "reference",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Delta rule over `[B, T, H, D]` tensors (the peer's conventions).

    Args:
        q (Tensor): `[B, T, H, K]` queries; k likewise (L2-normalised keys keep it stable).
        v (Tensor): `[B, T, HV, V]` values, HV a multiple of H.
        beta (Tensor): `[B, T, HV]` write strength.
        scale (float, Optional): multiplied into q.
            Default: `K ** -0.5`.
        initial_state (Tensor, Optional): `[N, HV, K, V]` state to start from (fp32).
        output_final_state (bool, Optional): also return the final state.
            Default: `False`.
        inplace_final_state (bool, Optional): write the final state into `initial_state` and return it.
            Default: `False`.
        cu_seqlens (LongTensor, Optional): `[N + 1]` packed variable-length sequences (B == 1).
        use_qk_l2norm_in_kernel (bool, Optional): L2-normalise q and k first (eps 1e-6).
            Default: `False`.
        backend (str, Optional): "reference", "triton" or "auto".
            Default: `"reference"`.

    Returns:
        o `[B, T, HV, V]` (dtype of v) and the final state `[N, HV, K, V]` fp32 (None unless asked).
    """
    return run_delta(
        "none",
        q,
        k,
        v,
        None,
        beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        inplace_final_state=inplace_final_state,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        backend=backend,
    )
