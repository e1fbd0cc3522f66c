"""Helpers shared by the softmax-attention family (`attention`, `dsa`, `nsa`).

Positions: queries are the last `Tq` positions of a key sequence of length `Tk`, so query row `i`
sits at absolute position `i + Tk - Tq`. Every mask below is written in those absolute positions.
"""

from __future__ import annotations

import torch

from .backend import check_float, check_shape

_INT64_MIN = -(2**63)


def rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when its last dim is contiguous and its other strides are multiples of 16
    elements (kernels that take those strides read it in place: the lowering's KV caches are
    views), else a contiguous copy.

    Triton vectorises loads only along rows whose strides it can prove 16-divisible: a column
    slice of the fused projections' GEMM output (DSA's v, rows 6472 elements apart at dim 2048)
    compiled to scalar loads (`tests/kernels/test_dsa_compile.py`), and the fused DSA block ran
    1.5x slower than the unfused one on the H200.
    """
    aligned = all(s % 16 == 0 for s in t.stride()[:-1])
    return t if t.stride(-1) == 1 and aligned else t.contiguous()


def compute_dtype(*ts: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64 (the reference truth), else float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


def split_cu_seqlens(cu_seqlens, Tq: int, Tk: int):
    """Normalise `cu_seqlens` (a `[N+1]` tensor or a `(cu_q, cu_k)` pair) to two int lists.

    Returns (cu_q, cu_k) as Python lists; with a single tensor both are the same.
    """
    if isinstance(cu_seqlens, tuple | list):
        cu_q, cu_k = cu_seqlens
    else:
        cu_q = cu_k = cu_seqlens
    cu_q, cu_k = [int(x) for x in cu_q.tolist()], [int(x) for x in cu_k.tolist()]
    if len(cu_q) != len(cu_k) or cu_q[0] != 0 or cu_k[0] != 0 or cu_q[-1] != Tq or cu_k[-1] != Tk:
        raise ValueError(f"cu_seqlens must start at 0 and end at T (Tq={Tq}, Tk={Tk}), got {cu_q} / {cu_k}")
    for n in range(len(cu_q) - 1):
        if cu_q[n + 1] < cu_q[n] or cu_k[n + 1] - cu_k[n] < cu_q[n + 1] - cu_q[n]:
            raise ValueError("each sequence needs 0 <= Tq_n <= Tk_n in cu_seqlens")
    return cu_q, cu_k


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens=None) -> tuple[int, ...]:
    """Validate q `[B, Tq, HQ, K]`, k `[B, Tk, HKV, K]`, v `[B, Tk, HKV, V]`; return the sizes.

    Returns (B, Tq, Tk, HQ, HKV, K, V). HQ must be a multiple of HKV (GQA).
    """
    check_shape("q", q, [None] * 4, "[B, Tq, HQ, K]")
    B, Tq, HQ, K = q.shape
    check_shape("k", k, [B, None, None, K], "[B, Tk, HKV, K]")
    Tk, HKV = k.shape[1], k.shape[2]
    check_shape("v", v, [B, Tk, HKV, None], "[B, Tk, HKV, V]")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, t)
    if HQ % HKV != 0:
        raise ValueError(f"query heads HQ={HQ} must be a multiple of kv heads HKV={HKV}")
    if cu_seqlens is None and Tq > Tk:
        raise ValueError(f"q must not be longer than k: Tq={Tq} > Tk={Tk} (queries are the last Tq keys)")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"cu_seqlens needs packed inputs with B == 1, got B={B}")
    return B, Tq, Tk, HQ, HKV, K, v.shape[-1]


def visible_mask(Tq: int, Tk: int, causal: bool, window: int | None, device) -> torch.Tensor:
    """Boolean `[Tq, Tk]`: key j visible to query i (at position i + Tk − Tq).

    Causal: j ≤ pos(i); window w (mixers.md §9): additionally j ≥ pos(i) − w + 1 (w keys incl. self).
    """
    pos = torch.arange(Tq, device=device)[:, None] + (Tk - Tq)
    j = torch.arange(Tk, device=device)[None, :]
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= pos
    if window is not None:
        mask &= j >= pos - window + 1
    return mask


def repeat_kv(x: torch.Tensor, G: int) -> torch.Tensor:
    """`[B, T, HKV, D]` -> `[B, T, HKV*G, D]`: query head h reads kv head h // G."""
    return x if G == 1 else x.repeat_interleave(G, dim=2)


def rank_keys(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """int64 sort keys: higher score first, ties broken by the lower index; invalid slots last.

    `scores`, `valid`: `[..., N]` (N < 2**31). The float is mapped to an order-preserving int32 and
    packed above the reversed index, so `topk` on the keys is deterministic (mixers.md §10(e)).
    """
    bits = scores.float().contiguous().view(torch.int32).to(torch.int64)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # monotone in the float value
    n = scores.shape[-1]
    idx = torch.arange(n, device=scores.device, dtype=torch.int64)
    key = ordered * (2**31) + (2**31 - 1 - idx)
    return key.masked_fill(~valid, _INT64_MIN)


def topk_select(scores: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the top-`k` valid entries along the last dim, in rank order, padded with −1.

    scores, valid: `[..., N]`. Returns a LongTensor `[..., k]`; ties pick the lower index.
    """
    n = scores.shape[-1]
    kk = min(k, n)
    if scores.dtype == torch.float64:
        # exact in float64: a stable descending sort keeps lower indices first among ties
        s = scores.masked_fill(~valid, float("-inf"))
        idx = torch.sort(s, dim=-1, descending=True, stable=True)[1][..., :kk]
        idx = idx.masked_fill(~valid.gather(-1, idx), -1)
        return _pad_last(idx, k)
    keys = rank_keys(scores, valid)
    top, idx = torch.topk(keys, kk, dim=-1, sorted=True) if kk > 0 else (keys[..., :0], keys[..., :0])
    return _pad_last(idx.masked_fill(top == _INT64_MIN, -1), k)


def _pad_last(idx: torch.Tensor, k: int) -> torch.Tensor:
    """Pad the last dim of an index tensor with −1 up to `k`."""
    if idx.shape[-1] >= k:
        return idx
    return torch.cat([idx, idx.new_full((*idx.shape[:-1], k - idx.shape[-1]), -1)], dim=-1)


def run_by_sequence(fn, cu_seqlens, q_like: dict, k_like: dict, **kwargs):
    """Call `fn(**q_like, **k_like, **kwargs)` once per packed sequence and concat along T.

    `q_like` tensors (`[1, Tq, ...]` or None) are sliced with cu_q, `k_like` with cu_k; `fn` returns
    one tensor (or a tuple of tensors) laid out like q.
    """
    ref = next(t for t in q_like.values() if t is not None)
    Tq = ref.shape[1]
    Tk = next(t for t in k_like.values() if t is not None).shape[1]
    cu_q, cu_k = split_cu_seqlens(cu_seqlens, Tq, Tk)
    outs = []
    for n in range(len(cu_q) - 1):
        qs = {a: None if t is None else t[:, cu_q[n] : cu_q[n + 1]] for a, t in q_like.items()}
        ks = {a: None if t is None else t[:, cu_k[n] : cu_k[n + 1]] for a, t in k_like.items()}
        outs.append(fn(**qs, **ks, **kwargs))
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts, dim=1) for parts in zip(*outs))
    return torch.cat(outs, dim=1)
