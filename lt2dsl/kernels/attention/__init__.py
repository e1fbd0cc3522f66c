"""`attention`: full / sliding-window softmax attention with GQA and a fused sigmoid output gate.

Math: mixers.md §9 (window: key j visible to query i iff i − w + 1 ≤ j ≤ i) and §12 (output gate
σ(g) ⊙ o after SDPA). RoPE is applied by the caller. Files: `naive.py` (per-query truth),
`reference.py` (dense masked PyTorch), `triton_fwd.py` / `triton_bwd.py` (tiled online softmax;
`recipe.py` says how the backward forms dQ),
`decode.py` (flash-decoding over a KV cache or sliding-window ring buffer), `ops.py` (torch.library).
"""

from __future__ import annotations

import torch

from ..common.attn_utils import check_qkv, run_by_sequence
from ..common.backend import check_shape, resolve_backend
from .decode import attention_decode
from .naive import attention_naive
from .reference import attention_reference

__all__ = ["attention", "attention_decode", "attention_naive", "attention_reference"]


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, window: int | None = None,
    gate: torch.Tensor | None = None, scale: float | None = None,
    cu_seqlens: torch.LongTensor | tuple[torch.LongTensor, torch.LongTensor] | None = None,
    backend: str = "reference", recipe: str = "",
) -> torch.Tensor:  # fmt: skip
    """Softmax attention with grouped query heads, optional sliding window and output gate.

    Args:
        q (torch.Tensor): queries `[B, Tq, HQ, K]`. When Tq < Tk the queries are the last Tq
            positions of the key sequence (prefill onto a cache, decode).
        k (torch.Tensor): keys `[B, Tk, HKV, K]`; query head h reads kv head h // (HQ // HKV).
        v (torch.Tensor): values `[B, Tk, HKV, V]`.
        causal (bool, Optional): mask keys after the query position. Default: `True`.
        window (int, Optional): sliding window w ≥ 1 counting the query's own key: key j is
            visible to the query at position p iff p − w + 1 ≤ j ≤ p (needs `causal`). Default: `None`.
        gate (torch.Tensor, Optional): pre-sigmoid gate logits, `[B, Tq, HQ, V]` (elementwise) or
            `[B, Tq, HQ]` (headwise); the output is σ(gate) ⊙ o, computed in fp32. Default: `None`.
        scale (float, Optional): score scale; default `K ** -0.5`.
        cu_seqlens (torch.LongTensor or (cu_q, cu_k), Optional): packed variable-length batch with
            `B == 1`; with a pair, sequence n has queries cu_q[n]:cu_q[n+1] that are the last
            positions of its keys cu_k[n]:cu_k[n+1]. Default: `None`.
        backend (str, Optional): "reference", "triton" or "auto". Default: "reference".
        recipe (str, Optional): the Triton backward's recipe, a name of `recipe.RECIPES` ("ds",
            "split"); "" picks the default for the call's shape. Default: "".

    Returns:
        o (torch.Tensor): `[B, Tq, HQ, V]` in the dtype of `v`.
    """
    B, Tq, Tk, HQ, HKV, K, V = check_qkv(q, k, v, cu_seqlens)
    _check_options(causal, window, gate, (B, Tq, HQ, V))
    scale = K**-0.5 if scale is None else float(scale)
    kw = dict(causal=causal, window=window, scale=scale)
    if resolve_backend(backend, q) == "triton":
        from .ops import attention_triton

        return attention_triton(q, k, v, gate=gate, cu_seqlens=cu_seqlens, recipe=recipe, **kw)
    if cu_seqlens is None:
        return attention_reference(q, k, v, gate=gate, **kw)
    return run_by_sequence(attention_reference, cu_seqlens, dict(q=q, gate=gate), dict(k=k, v=v), **kw)


def _check_options(causal: bool, window: int | None, gate: torch.Tensor | None, qshape) -> None:
    """Window needs causal and w ≥ 1; gate is `[B, Tq, HQ, V]` or `[B, Tq, HQ]`."""
    if window is not None:
        if not causal:
            raise ValueError("window needs causal=True (the window is the w most recent keys)")
        if int(window) < 1:
            raise ValueError(f"window must be >= 1 (it counts the query's own key), got {window}")
    if gate is None:
        return
    B, Tq, HQ, V = qshape
    if gate.dim() == 3:
        check_shape("gate", gate, [B, Tq, HQ], "[B, Tq, HQ] (headwise)")
    else:
        check_shape("gate", gate, [B, Tq, HQ, V], "[B, Tq, HQ, V] (elementwise)")
