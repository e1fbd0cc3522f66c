"""The lightning indexer's KL alignment loss (mixers.md §11(b)), for training code.

L = Σ_t KL(p_t ‖ softmax(I[t, S_t])): p_t is the main attention's probability over the keys S_t, summed
over heads and L1-normalised. It is a fixed target (q and k are detached), so the loss trains only the
indexer (q_idx, k_idx, w_idx). S_t is every causal key of t's sequence (the dense warm-up) or, with
`indices`, the keys t selected (the sparse stage).

Cost. The sparse stage gathers each query's k selected keys (main keys for the target, index keys for
the logits): O(T·k) work and memory, never a `[T, T]` tensor. On the Triton backend it is one fused
kernel each way (`triton_loss`: forward, and a backward that scatters dk_I with atomics); the eager
form below stays the reference backend's, and float64's. The dense stage scores a query chunk
against the key window its documents reach (the chunk's first document start to its last query).
A packed row (`cu_seqlens`) goes in one pass, not one per document: masks keep every query inside
its document. Query chunks are sized by an element budget and checkpointed, so backward keeps only
the inputs and, in the sparse stage, the targets `[B, T, k]`. The per-row formula it is tested
against is `reference.dsa_indexer_kl_reference`.
"""

from __future__ import annotations

import bisect
import math

import torch
from torch.utils.checkpoint import checkpoint

from ..common.attn_utils import compute_dtype
from ..common.backend import resolve_backend
from .reference import doc_starts, indexer_scores, masked_softmax, to_global

# Elements of a chunk's largest tensor (the gathered main keys, or the dense scores): 2^27 is
# 256 MiB of bf16 keys, and a layer's loss at T = 32k, topk 256, 4 kv heads of 64 takes 16 chunks
# (a chunk costs ~150 eager ops, which bounds the loss on the GPU as much as its bytes do).
BUDGET = 2**27
SHORT = 256


def dsa_indexer_kl(
    q: torch.Tensor,
    k: torch.Tensor,
    q_idx: torch.Tensor,
    k_idx: torch.Tensor,
    w_idx: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    idx_scale: float | None = None,
    indices: torch.LongTensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    reduction: str = "sum",
    chunk: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """KL(p_t ‖ softmax(I_t)) of the indexer against the main attention, summed over heads.

    Args:
        q (torch.Tensor): main queries `[B, Tq, HQ, K]` (detached here), the last Tq of the keys.
        k (torch.Tensor): main keys `[B, Tk, HKV, K]` (detached here).
        q_idx (torch.Tensor): index queries `[B, Tq, HI, DI]`.
        k_idx (torch.Tensor): index keys `[B, Tk, DI]`.
        w_idx (torch.Tensor, Optional): head weights `[B, Tq, HI]`; None: all ones.
        scale (float, Optional): main attention scale; default `K ** -0.5`.
        idx_scale (float, Optional): factor inside the ReLU of the index score; default
            `(HI · DI) ** -0.5` as in mixers.md §11(b). The softmax is not scale-invariant, unlike the
            top-k, so this is the sheet's value rather than the `dsa` op's selection default `DI ** -0.5`;
            pass `DI ** -0.5` when `w_idx` already carries the `HI ** -0.5` factor.
        indices (torch.LongTensor, Optional): `[B, Tq, topk]` selection of the sparse stage (−1 pads;
            keys past the query or repeated count once), local to each document with `cu_seqlens`.
        cu_seqlens (torch.Tensor, Optional): `[N + 1]` document starts of a packed row (B = 1,
            Tq = Tk): every document is a sequence of its own. Default: `None`.
        reduction (str, Optional): "sum" (Σ over queries and batch), "mean" or "none" (`[B, Tq]`).
        chunk (int, Optional): queries per chunk of the eager form; default: as many as fit `BUDGET`.
        backend (str, Optional): "reference", "triton" or "auto" (Triton on CUDA): the sparse stage's
            fused kernels (`triton_loss`; float32/bfloat16/float16 inputs, "auto" falls back to the
            eager form for float64). The dense stage is always the eager form. Default: `"auto"`.

    Returns:
        loss (torch.Tensor): scalar (or `[B, Tq]`), float32 (float64 for float64 inputs).
    """
    B, Tq, HQ, K = q.shape
    Tk = k.shape[1]
    if reduction not in ("sum", "mean", "none"):
        raise ValueError(f"reduction must be 'sum', 'mean' or 'none', got {reduction!r}")
    if cu_seqlens is not None and (B != 1 or Tq != Tk):
        raise ValueError(f"cu_seqlens takes one packed row with Tq == Tk, got B={B}, Tq={Tq}, Tk={Tk}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    scale = K**-0.5 if scale is None else scale
    idx_scale = (q_idx.shape[2] * q_idx.shape[3]) ** -0.5 if idx_scale is None else idx_scale
    dt = compute_dtype(q, k, q_idx, k_idx, w_idx)
    if indices is not None and _fused(backend, q, dt):
        with torch.autocast(q.device.type, enabled=False):
            per_query = _sparse_fused(q, k, q_idx, k_idx, w_idx, scale, idx_scale, indices, cu_seqlens)
        return _reduce(per_query, reduction)
    # Autocast off: the softmaxes and the index scores are in dt (fp32, or float64 for the truth); the
    # main scores are products in k's dtype (bf16 when training in bf16, as autocast made them), so the
    # main keys gathered per query, the loss's largest tensor, stay in k's dtype.
    with torch.autocast(q.device.type, enabled=False):
        qs = (q.detach().to(dt) * scale).to(k.dtype).unflatten(2, (k.shape[2], HQ // k.shape[2]))
        args = (qs, k.detach(), q_idx.to(dt), k_idx.to(dt), None if w_idx is None else w_idx.to(dt))
        if indices is None:
            per_query = _dense(*args, idx_scale, chunk, cu_seqlens)
        else:
            sel = indices if cu_seqlens is None else to_global(indices, cu_seqlens)
            per_query = _sparse(*args, idx_scale, chunk, sel)
    return _reduce(per_query, reduction)


def _reduce(per_query: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return per_query
    return per_query.sum() if reduction == "sum" else per_query.mean()


def _fused(backend: str, ref: torch.Tensor, dt: torch.dtype) -> bool:
    """Whether the sparse stage runs the Triton kernels: the backend resolves to Triton and no input
    is float64 ("auto" then takes the eager form, "triton" refuses)."""
    if resolve_backend(backend, ref) != "triton":
        return False
    if dt == torch.float64:
        if backend == "auto":
            return False
        raise ValueError("backend='triton' takes float32, bfloat16 and float16; use 'reference' for float64")
    return True


def _sparse_fused(q, k, q_idx, k_idx, w_idx, scale: float, idx_scale: float, indices, cu_seqlens):
    """Per-query KL `[B, Tq]` by `triton_loss.dsa_kl_fwd_op`: q and k in one dtype, q_idx and k_idx in
    one (their promotion), head weights of 1 when `w_idx` is None, each query's selection sorted
    (a repeated key then neighbours itself) and its document's first position."""
    from .triton_loss import dsa_kl_fwd_op

    B, Tq, HI, _ = q_idx.shape
    main = torch.promote_types(q.dtype, k.dtype)
    idx = torch.promote_types(q_idx.dtype, k_idx.dtype)
    if w_idx is None:
        w_idx = torch.ones(B, Tq, HI, dtype=idx, device=q_idx.device)
    if cu_seqlens is None:
        start = torch.zeros(Tq, dtype=torch.int64, device=q.device)
    else:
        start = doc_starts(cu_seqlens.to(q.device), Tq)
    sel = indices.to(torch.int64).sort(dim=-1).values
    q, k = (t.detach().to(main).contiguous() for t in (q, k))
    q_idx, k_idx = (t.to(idx).contiguous() for t in (q_idx, k_idx))
    w_idx = w_idx.contiguous()
    return dsa_kl_fwd_op(q, k, q_idx, k_idx, w_idx, sel, start, float(scale), float(idx_scale))[0]


def _sparse(qs, k, q_idx, k_idx, w_idx, idx_scale: float, chunk, sel) -> torch.Tensor:
    """Per-query KL `[B, Tq]` over the selected keys `sel [B, Tq, n]` (positions in the row) of the
    scaled queries `qs [B, Tq, HKV, G, K]`."""
    B, Tq, HKV, _, K = qs.shape
    Tk, n = k.shape[1], sel.shape[-1]
    kh = k.transpose(1, 2).contiguous()  # [B, HKV, Tk, K]: gathers land as [B, c, HKV, n, K]
    c = chunk or max(1, BUDGET // (B * n * HKV * K))
    pos = torch.arange(Tq, device=qs.device) + (Tk - Tq)
    starts = range(0, Tq, c)
    rows = []
    for a, qi, w in zip(starts, *_split_rows((q_idx, w_idx), [min(c, Tq - a) for a in starts])):
        b = a + qi.shape[1]
        valid, idx = selected(sel[:, a:b], pos[a:b], Tk)
        with torch.no_grad():
            s = qs[:, a:b] @ _gather_heads(kh, idx).transpose(-1, -2)  # [B, c, HKV, G, n]
            target = _head_summed(s.to(q_idx.dtype), valid[:, :, None, None])
        args = (target, qi, k_idx, w, idx, valid, idx_scale)
        rows.append(checkpoint(_gathered_kl, *args, use_reentrant=False))
    return torch.cat(rows, dim=1)


def _split_rows(ts: tuple, sizes: list[int]) -> list:
    """Each tensor of `ts` (`[B, T, ...]`, or None) split along T into `sizes`: its backward is one
    concatenation, where slices would each write a zero-padded gradient of the whole row."""
    return [[None] * len(sizes) if t is None else t.split(sizes, dim=1) for t in ts]


def selected(sel: torch.Tensor, pos: torch.Tensor, Tk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid `[B, c, n]`, keys `[B, c, n]`): each query's distinct selected keys s, 0 ≤ s ≤ pos < Tk,
    in index order; the invalid slots hold key 0."""
    ok = (sel >= 0) & (sel <= pos[:, None]) & (sel < Tk)
    keys = torch.where(ok, sel, -1).sort(dim=-1).values
    valid = keys >= 0
    valid[..., 1:] &= keys[..., 1:] != keys[..., :-1]
    return valid, keys.clamp_min(0)


def _gather_heads(kh: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows of `kh [B, H, T, K]` at `idx [B, c, n]`: `[B, c, H, n, K]`."""
    B, H = kh.shape[:2]
    b = torch.arange(B, device=kh.device)[:, None, None, None]
    h = torch.arange(H, device=kh.device)[None, None, :, None]
    return kh[b, h, idx[:, :, None, :]]


def _gathered_kl(target, q_idx, k_idx, w_idx, idx, valid, idx_scale: float) -> torch.Tensor:
    """KL `[B, c]` of the index scores of q_idx `[B, c, HI, DI]` over the keys `idx` against `target`."""
    keys = k_idx[torch.arange(k_idx.shape[0], device=k_idx.device)[:, None, None], idx]  # [B, c, n, DI]
    dots = torch.relu(idx_scale * (q_idx @ keys.transpose(-1, -2)))  # [B, c, HI, n]
    logits = dots.sum(2) if w_idx is None else (w_idx.unsqueeze(-2) @ dots).squeeze(-2)
    return _kl(target, logits, valid)


def _dense(qs, k, q_idx, k_idx, w_idx, idx_scale: float, chunk, cu_seqlens) -> torch.Tensor:
    """Per-query KL `[B, Tq]` over every key of the query's document up to the query."""
    B, Tq, HKV, G, _ = qs.shape
    Tk = k.shape[1]
    pos = torch.arange(Tq, device=qs.device) + (Tk - Tq)
    first = None if cu_seqlens is None else doc_starts(cu_seqlens.to(qs.device), Tq)
    starts = [0] if cu_seqlens is None else cu_seqlens.tolist()[:-1]
    spans = windows(Tq, Tk, starts, B * HKV * G, chunk)
    rows = []
    for (a, b, lo), qi, w in zip(spans, *_split_rows((q_idx, w_idx), [b - a for a, b, _ in spans])):
        hi = b + Tk - Tq
        keys = torch.arange(lo, hi, device=qs.device)
        mask = keys <= pos[a:b, None]
        if first is not None:
            mask = mask & (keys >= first[a:b, None])
        args = (qs[:, a:b], k[:, lo:hi], qi, k_idx[:, lo:hi], w, mask, idx_scale)
        rows.append(checkpoint(_dense_kl, *args, use_reentrant=False))
    return torch.cat(rows, dim=1)


def windows(Tq: int, Tk: int, starts: list[int], heads: int, chunk: int | None) -> list[tuple[int, int, int]]:
    """(a, b, lo) per query chunk: rows a..b−1 score keys lo..b−1+Tk−Tq, lo the document start of
    row a (`starts`: sorted document starts). `chunk` rows each; without it, a chunk's
    `heads · rows · keys` scores fit `BUDGET / 4` (they exist in fp32 a few times over; at least one
    row), and it ends at the first document start `SHORT` or more keys after lo, so short documents
    share a chunk and every row scores fewer than `SHORT` keys of earlier documents."""
    out, a = [], 0
    while a < Tq:
        lo = starts[bisect.bisect_right(starts, a) - 1]
        if chunk:
            b = min(Tq, a + chunk)
        else:
            b = min(Tq, a + _rows_within(BUDGET // (4 * heads), a + Tk - Tq + 1 - lo))
            cut = bisect.bisect_left(starts, max(lo + SHORT, a + 1))
            b = min(b, starts[cut]) if cut < len(starts) else b
        out.append((a, b, lo))
        a = b
    return out


def _rows_within(budget: int, reach: int) -> int:
    """The most rows c (≥ 1) with c · (reach + c) ≤ budget."""
    return max(1, int((math.sqrt(reach * reach + 4 * budget) - reach) / 2))


def _dense_kl(qs, k, q_idx, k_idx, w_idx, mask, idx_scale: float) -> torch.Tensor:
    """KL `[B, c]` of queries `[B, c, ...]` over the window keys `[B, S, ...]` that `mask [c, S]` allows."""
    with torch.no_grad():
        s = torch.einsum("bcngd,bknd->bcngk", qs, k)
        target = _head_summed(s.to(q_idx.dtype), mask[None, :, None, None])
    return _kl(target, indexer_scores(q_idx, k_idx, w_idx, idx_scale, q_idx.dtype), mask[None])


def _head_summed(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax of `s [B, c, HKV, G, N]` over `mask`, summed over heads and L1-normalised: `[B, c, N]`."""
    p = masked_softmax(s, mask).sum((2, 3))
    return p / p.sum(-1, keepdim=True).clamp_min(1e-30)


def _kl(target: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_s target · (log target − log_softmax(logits)) over `mask` `[B, c, N]` -> `[B, c]`.

    A row with no allowed key has logits 0 (not −inf) before the log-softmax, so neither it nor its
    gradient is NaN; its target is 0, so its KL is 0."""
    logits = logits.masked_fill(~mask, float("-inf"))
    logits = torch.where(mask.any(-1, keepdim=True), logits, logits.new_zeros(()))
    logq = torch.log_softmax(logits, dim=-1)
    tiny = torch.finfo(target.dtype).tiny
    return torch.where(target > 0, target * (torch.log(target.clamp_min(tiny)) - logq), 0.0).sum(-1)
