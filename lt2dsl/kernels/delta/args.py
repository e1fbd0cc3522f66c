"""Argument checks and small helpers shared by the delta-rule family.

The three ops (`gated_delta_rule`, `delta_rule`, `kda`) take the same tensors except for the gate:

* `gate="none"`    (DeltaNet): no `g`.
* `gate="scalar"`  (GDN):      `g` `[B, T, HV]`, one log decay per value head and token.
* `gate="channel"` (KDA):      `g` `[B, T, HV, K]`, one log decay per key channel.
"""

from __future__ import annotations

from itertools import pairwise

import torch

from lt2dsl.kernels.common.backend import Dims, check_float, check_shape

GATES = ("none", "scalar", "channel")


def check_delta_args(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, beta: torch.Tensor, gate: str,
    initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, inplace_final_state: bool = False,
) -> Dims:  # fmt: skip
    """Validate the tensors of a delta-rule call and return its sizes; raise ValueError otherwise."""
    check_shape("q", q, [None] * 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    check_shape("k", k, [B, T, H, K], "[B, T, H, K]")
    check_shape("v", v, [B, T, None, None], "[B, T, HV, V]")
    HV, V = v.shape[2], v.shape[3]
    if HV % H != 0:
        raise ValueError(f"value heads HV={HV} must be a multiple of q/k heads H={H}")
    for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        check_float(name, t)
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_shape("beta", beta, [B, T, HV], "[B, T, HV]")
    _check_gate(g, gate, B, T, HV, K)
    N = _check_cu_seqlens(cu_seqlens, B)
    if initial_state is not None:
        check_shape("initial_state", initial_state, [N, HV, K, V], "[N, HV, K, V]")
        check_float("initial_state", initial_state)
    if inplace_final_state and initial_state is None:
        raise ValueError("inplace_final_state=True needs an `initial_state` tensor to write into")
    return Dims(B, T, H, HV, K, V, N)


def _check_gate(g: torch.Tensor | None, gate: str, B: int, T: int, HV: int, K: int) -> None:
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    if gate == "none":
        return
    if gate == "scalar":
        check_shape("g", g, [B, T, HV], "[B, T, HV]")
    else:
        check_shape("g", g, [B, T, HV, K], "[B, T, HV, K]")
    check_float("g", g)


def _check_cu_seqlens(cu_seqlens: torch.Tensor | None, B: int) -> int:
    if cu_seqlens is None:
        return B
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError("`cu_seqlens` must be a 1-D LongTensor [N + 1] = [0, l1, l1 + l2, ...]")
    if cu_seqlens.is_floating_point():
        raise ValueError(f"`cu_seqlens` must be an integer tensor, got {cu_seqlens.dtype}")
    if B != 1:
        raise ValueError(f"with `cu_seqlens` the batch must be packed along T with B == 1, got B={B}")
    return cu_seqlens.numel() - 1


def state_dtype(x: torch.Tensor) -> torch.dtype:
    """Recurrent states are fp32, or float64 when the inputs are float64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def expand_heads(x: torch.Tensor, G: int) -> torch.Tensor:
    """[B, T, H, D] -> [B, T, H*G, D]: value head j reads q/k head j // G."""
    return x if G == 1 else x.repeat_interleave(G, dim=2)


def seq_bounds(cu_seqlens: torch.Tensor | None, B: int, T: int) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of every sequence: the B rows, or the packed cu_seqlens segments."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = cu_seqlens.tolist()
    if cu[0] != 0 or cu[-1] != T or any(a > b for a, b in pairwise(cu)):
        raise ValueError(f"`cu_seqlens` must rise from 0 to T={T}, got {cu}")
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
