"""The body `gla` and `simple_gla` share once each has checked its decay g: state checks, the
default scale, and the choice between the Triton chunk op and the chunked PyTorch reference."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..common.backend import Dims, pick_backend
from ..decay.utils import check_inplace, check_state, run_by_sequence, write_final_state


def chunk_op(family: str) -> Callable:
    """`lt2dsl::{family}_chunk_fwd`, registered by importing the family's `ops` on first use: the
    reference path needs no Triton (plain imports, which torch.compile traces)."""
    if family == "gla":
        from . import ops as gla_ops  # noqa: F401  (registers the op)

        return torch.ops.lt2dsl.gla_chunk_fwd
    from ..simple_gla import ops as simple_gla_ops  # noqa: F401  (registers the op)

    return torch.ops.lt2dsl.simple_gla_chunk_fwd


def decay_front(
    family: str,
    chunk_ref: Callable,
    d: Dims,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    scale: float | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    inplace_final_state: bool,
    cu_seqlens: torch.LongTensor | None,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """o `[B, T, HV, V]` (dtype of v) and the final state `[N, HV, K, V]` (fp32, or None unless asked
    for): under backend="triton" the family's op (`chunk_op`, family "gla" or "simple_gla"), else
    `chunk_ref(q, k, v, g, scale, h0)` per batch of equal-length sequences."""
    check_state("initial_state", initial_state, [d.N, d.HV, d.K, d.V], "[N, HV, K, V]")
    check_inplace(inplace_final_state, initial_state)
    scale = d.K**-0.5 if scale is None else float(scale)
    want_final = output_final_state or inplace_final_state
    if pick_backend(backend, q) == "triton":
        from ..decay.ops import prepare_inputs, run_decay_triton

        op = chunk_op(family)
        q, k, v, g, h0 = prepare_inputs(q, k, v, g, initial_state)
        args = (q, k, v, g, h0, initial_state, scale, want_final, inplace_final_state, cu_seqlens)
        return run_decay_triton(op, *args)

    def run(q_, k_, v_, g_, h0):  # one batch of equal-length sequences
        return chunk_ref(q_, k_, v_, g_, scale, h0)

    o, final = run_by_sequence(run, cu_seqlens, [q, k, v, g], initial_state)
    final = write_final_state(final, initial_state, inplace_final_state) if want_final else None
    return o.to(v.dtype), final
