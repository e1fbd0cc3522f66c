"""Backend dispatch shared by `gated_delta_rule`, `delta_rule` and `kda`."""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.backend import resolve_backend
from lt2dsl.kernels.common.delta_args import check_delta_args, l2norm
from lt2dsl.kernels.common.delta_chunk_ref import delta_chunk_ref

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


MAX_TRITON_K = 256  # widest key head the Triton kernels tile (validation warns with W0401)


def pick_backend(backend: str, q: torch.Tensor) -> str:
    """ "reference" or "triton". float64 and key heads wider than 256 have no Triton kernel:
    "auto" falls back to the reference, "triton" refuses."""
    which = resolve_backend(backend, q, has_triton=True)
    if which == "triton" and (q.dtype not in TRITON_DTYPES or q.shape[-1] > MAX_TRITON_K):
        if backend == "auto":
            return "reference"
        raise ValueError(
            f"backend='triton' supports {TRITON_DTYPES} and key head dims ≤ {MAX_TRITON_K}, "
            f"got {q.dtype} with K={q.shape[-1]}; use 'reference'"
        )
    return which


def run_delta(
    gate: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    *,
    scale: float | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    inplace_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm_in_kernel: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Check the arguments, run the chosen backend, honour `inplace_final_state`."""
    dims = check_delta_args(q, k, v, g, beta, gate, initial_state, cu_seqlens, inplace_final_state)
    scale = dims.K**-0.5 if scale is None else float(scale)
    want_state = output_final_state or inplace_final_state
    which = pick_backend(backend, q)
    if which == "triton":
        from lt2dsl.kernels.common.delta_triton import delta_triton

        o, S = delta_triton(
            gate,
            q,
            k,
            v,
            g,
            beta,
            scale,
            initial_state,
            want_state,
            inplace_final_state,
            cu_seqlens,
            use_qk_l2norm_in_kernel,
        )
        return o, S
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    o, S = delta_chunk_ref(
        q,
        k,
        v,
        g,
        beta,
        gate=gate,
        scale=scale,
        initial_state=initial_state,
        output_final_state=want_state,
        cu_seqlens=cu_seqlens,
    )
    if inplace_final_state:
        with torch.no_grad():
            initial_state.copy_(S)
        S = initial_state
    return o, S
