"""Argument checks, state handling and varlen helpers shared by the decay family.

Used by `gla`, `simple_gla` and `mlstm` (mixers.md §1–3, §7, §8). All of them take q, k
`[B, T, H, K]`, v `[B, T, HV, V]` with grouped value heads (value head j reads q/k head
j // (HV // H)) and keep recurrent states in fp32 (float64 when the inputs are float64).
"""

from __future__ import annotations

import torch

from ..common.backend import Dims, check_float, check_shape


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens) -> Dims:
    """Validate q, k `[B, T, H, K]`, v `[B, T, HV, V]` (HV a multiple of H) and cu_seqlens."""
    check_shape("q", q, [None, None, None, None], "[B, T, H, K]")
    check_float("q", q)
    B, T, H, K = q.shape
    check_shape("k", k, [B, T, H, K], "[B, T, H, K]")
    check_shape("v", v, [B, T, None, None], "[B, T, HV, V]")
    check_float("k", k)
    check_float("v", v)
    HV, V = v.shape[2], v.shape[3]
    if HV % H != 0:
        raise ValueError(f"value heads HV={HV} must be a multiple of q/k heads H={H} (v is [B, T, HV, V])")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return Dims(B, T, H, HV, K, V, num_sequences(cu_seqlens, B, T))


def num_sequences(cu_seqlens: torch.Tensor | None, B: int, T: int) -> int:
    """N = B, or len(cu_seqlens) − 1 for a packed batch (which must have B == 1)."""
    if cu_seqlens is None:
        return B
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError("`cu_seqlens` must be a 1-D LongTensor [N + 1] = [0, l1, l1 + l2, ..., T]")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"`cu_seqlens` must be an integer tensor [N + 1], got {cu_seqlens.dtype}")
    if B != 1:
        raise ValueError(f"with `cu_seqlens` the batch must be packed along T with B == 1, got B={B}")
    if torch.compiler.is_compiling():  # value checks would be data-dependent guards in a traced graph
        return cu_seqlens.numel() - 1
    first, last = int(cu_seqlens[0]), int(cu_seqlens[-1])
    if first != 0 or last != T:
        raise ValueError(f"`cu_seqlens` must start at 0 and end at T={T}, got [{first}, ..., {last}]")
    if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise ValueError("`cu_seqlens` must be non-decreasing")
    return cu_seqlens.numel() - 1


def state_dtype(x: torch.Tensor) -> torch.dtype:
    """Recurrent states are fp32, or float64 when the inputs are float64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def check_state(name: str, s: torch.Tensor | None, shape: list[int], what: str) -> None:
    """`s` is None or a floating tensor of `shape` (spelled `what` in the error)."""
    if s is None:
        return
    check_shape(name, s, shape, what)
    check_float(name, s)


def check_inplace(inplace: bool, initial_state, names: str = "initial_state") -> None:
    """`inplace_final_state=True` needs an fp32/float64 initial state to write into."""
    if not inplace:
        return
    states = initial_state if isinstance(initial_state, tuple) else (initial_state,)
    if initial_state is None or any(s is None for s in states):
        raise ValueError(
            f"inplace_final_state=True needs `{names}` (the tensor the final state is written to)"
        )
    for s in states:
        if s.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"inplace_final_state=True needs fp32 or float64 `{names}`, got {s.dtype}")


def seq_bounds(cu_seqlens: torch.Tensor | None, B: int, T: int) -> list[tuple[int, int, int]]:
    """(batch index, start, end) of every sequence: B rows of length T, or the packed segments."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = cu_seqlens.tolist()
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def write_final_state(final, initial_state, inplace: bool):
    """Copy `final` into `initial_state` when `inplace` (tensor or tuple) and return what the op returns."""
    if not inplace:
        return final
    with torch.no_grad():
        if isinstance(final, tuple):
            for dst, src in zip(initial_state, final):
                dst.copy_(src)
        else:
            initial_state.copy_(final)
    return initial_state


def chunk_indices(cu_seqlens: torch.Tensor, chunk: int) -> torch.Tensor:
    """`[NT_total, 2]` int32 (sequence n, chunk index inside n) for every chunk of a packed batch."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    rows = [(n, c) for n, L in enumerate(lens) for c in range((L + chunk - 1) // chunk)]
    if not rows:
        return torch.zeros(0, 2, dtype=torch.int32, device=cu_seqlens.device)
    return torch.tensor(rows, dtype=torch.int32, device=cu_seqlens.device)


def chunk_offsets(cu_seqlens: torch.Tensor, chunk: int) -> torch.Tensor:
    """`[N + 1]` int32: index of the first chunk of every sequence in the packed chunk list."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    nt = (lens + chunk - 1) // chunk
    return torch.cat([nt.new_zeros(1), nt.cumsum(0)]).to(torch.int32)


def _state_slice(state, n: int):
    """Row n of a state (tensor, tuple of tensors, or None), keeping the leading dim."""
    if state is None:
        return None
    if isinstance(state, tuple):
        return tuple(s[n : n + 1] for s in state)
    return state[n : n + 1]


def _state_cat(states: list):
    if isinstance(states[0], tuple):
        return tuple(torch.cat(parts, dim=0) for parts in zip(*states))
    return torch.cat(states, dim=0)


def run_by_sequence(fn, cu_seqlens: torch.Tensor | None, seq_tensors: list, state):
    """Run `fn(*slices, state_n) -> (o, final_n)` on every packed sequence and reassemble.

    `seq_tensors` are `[1, T, ...]` tensors (or None) sliced along T; `state` is None, an `[N, ...]`
    tensor or a tuple of them. Returns o concatenated along T and the final states stacked `[N, ...]`.
    Without `cu_seqlens` the batch is one call, `fn(*seq_tensors, state)`.
    """
    if cu_seqlens is None:
        return fn(*seq_tensors, state)
    outs, finals = [], []
    for n, (_, s, e) in enumerate(seq_bounds(cu_seqlens, 1, int(cu_seqlens[-1]))):
        parts = [None if x is None else x[:, s:e] for x in seq_tensors]
        o, fin = fn(*parts, _state_slice(state, n))
        outs.append(o)
        finals.append(fin)
    return torch.cat(outs, dim=1), _state_cat(finals)
