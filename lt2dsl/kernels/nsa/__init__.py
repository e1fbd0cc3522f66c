"""`nsa`: Native Sparse Attention (compressed, selected and sliding-window branches with gates).

Argument conventions follow the peer's reference (fla `fla/ops/nsa/naive.py`, `parallel.py`): with
its defaults (mean-pooled compression, compression and selection blocks of `block_size`) both compute
the same function. Differences, on purpose: any query/kv head ratio (the peer needs HQ/HKV a power of
two ≥ 16); ties in block scores go to the lower block index; `g_swa=None` weighs the window branch 1
(like `g_slc=None`); with `g_cmp=None` the compressed branch is left out of the output but still drives
the block choice. Options on top (mixers.md §10): `cmp_block` (l), `cmp_stride` (d) and a learned
compression passed in as `k_cmp` / `v_cmp`.
Files: `common.py` (geometry), `naive.py`, `reference.py`, `triton_*.py`, `ops.py`.
"""

from __future__ import annotations

import torch

from ..common.attn_utils import check_qkv, run_by_sequence
from ..common.backend import check_shape, resolve_backend
from .common import NSAGeometry
from .naive import nsa_naive
from .reference import nsa_reference

__all__ = ["nsa", "nsa_naive", "nsa_reference"]


def nsa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    g_cmp: torch.Tensor | None = None, g_slc: torch.Tensor | None = None, g_swa: torch.Tensor | None = None,
    *, block_counts: int | torch.LongTensor = 16, block_size: int = 64, window_size: int = 0,
    scale: float | None = None, block_indices: torch.LongTensor | None = None,
    cmp_block: int | None = None, cmp_stride: int | None = None,
    k_cmp: torch.Tensor | None = None, v_cmp: torch.Tensor | None = None,
    cu_seqlens: torch.LongTensor | None = None, return_block_indices: bool = False,
    backend: str = "reference",
):  # fmt: skip
    """NSA forward, differentiable in q, k, v, the gates and `k_cmp`/`v_cmp` (not the block choice).

    Args:
        q (torch.Tensor): queries `[B, Tq, HQ, K]` (the last Tq positions when Tq < Tk: decode).
        k (torch.Tensor): keys `[B, Tk, HKV, K]`, any HQ % HKV == 0.
        v (torch.Tensor): values `[B, Tk, HKV, V]`.
        g_cmp, g_slc, g_swa (torch.Tensor, Optional): branch weights `[B, Tq, HQ]`, already activated
            (the layer applies the sigmoid). Default: `None` (see the module docstring).
        block_counts (int or torch.LongTensor): n selected blocks per query, or `[B, Tq, HKV]`.
            Default: `16`.
        block_size (int): selection block l' (and the default l and d). Default: `64`.
        window_size (int): sliding window w; 0 disables the branch. Default: `0`.
        scale (float, Optional): default `K ** -0.5`.
        block_indices (torch.LongTensor, Optional): `[B, Tq, HKV, S]` fixed selection (−1 pads).
        cmp_block (int, Optional): compression block l. Default: `block_size`.
        cmp_stride (int, Optional): compression stride d (divides l and l'). Default: `cmp_block`.
        k_cmp, v_cmp (torch.Tensor, Optional): caller-computed (e.g. learned) compressed keys/values
            `[B, NC, HKV, *]`, row i summarising tokens [i·d, i·d + l). Default: mean pooling.
        cu_seqlens (torch.LongTensor, Optional): packed sequences with `B == 1`. Default: `None`.
        return_block_indices (bool): also return the selection. Default: `False`.
        backend (str): "reference", "triton" or "auto".

    Returns:
        o (torch.Tensor): `[B, Tq, HQ, V]` in the dtype of v (and the selection `[B, Tq, HKV, S]`).
    """
    B, Tq, Tk, HQ, HKV, K, V = check_qkv(q, k, v, cu_seqlens)
    NSAGeometry.make(block_size, cmp_block, cmp_stride)
    # a dict literal, not locals(): Dynamo in torch 2.11 (the H200's) cannot trace locals()
    _check_nsa_args(
        dict(
            q=q,
            k=k,
            v=v,
            g_cmp=g_cmp,
            g_slc=g_slc,
            g_swa=g_swa,
            block_counts=block_counts,
            block_indices=block_indices,
            window_size=window_size,
            k_cmp=k_cmp,
            v_cmp=v_cmp,
        )
    )
    kw = dict(
        block_counts=block_counts,
        block_size=block_size,
        window_size=window_size,
        scale=scale,
        cmp_block=cmp_block,
        cmp_stride=cmp_stride,
    )
    inputs = dict(k_cmp=k_cmp, v_cmp=v_cmp, block_indices=block_indices)
    if resolve_backend(backend, q) == "triton":
        from .ops import nsa_triton

        o, idx = nsa_triton(q, k, v, g_cmp, g_slc, g_swa, cu_seqlens=cu_seqlens, **inputs, **kw)
    elif cu_seqlens is None:
        o, idx = nsa_reference(q, k, v, g_cmp, g_slc, g_swa, **inputs, **kw)
    else:
        if k_cmp is not None or not isinstance(block_counts, int):
            raise ValueError("cu_seqlens with k_cmp/v_cmp or tensor block_counts is not supported")
        o, idx = run_by_sequence(
            nsa_reference,
            cu_seqlens,
            dict(q=q, g_cmp=g_cmp, g_slc=g_slc, g_swa=g_swa, block_indices=block_indices),
            dict(k=k, v=v),
            **kw,
        )
    return (o, idx) if return_block_indices else o


def _check_nsa_args(a: dict) -> None:
    """Gate, count, index and compressed-input shapes."""
    B, Tq, HQ = a["q"].shape[:3]
    HKV = a["k"].shape[2]
    for name in ("g_cmp", "g_slc", "g_swa"):
        if a[name] is not None:
            check_shape(name, a[name], [B, Tq, HQ], "[B, Tq, HQ]")
    bc = a["block_counts"]
    if isinstance(bc, torch.Tensor):
        check_shape("block_counts", bc, [B, Tq, HKV], "[B, Tq, HKV]")
    elif int(bc) < 0:
        raise ValueError(f"block_counts must be >= 0, got {bc}")
    if a["block_indices"] is not None:
        check_shape("block_indices", a["block_indices"], [B, Tq, HKV, None], "[B, Tq, HKV, S]")
    if a["window_size"] < 0:
        raise ValueError(f"window_size must be >= 0, got {a['window_size']}")
    if (a["k_cmp"] is None) != (a["v_cmp"] is None):
        raise ValueError("pass both k_cmp and v_cmp, or neither")
    if a["k_cmp"] is not None:
        check_shape("k_cmp", a["k_cmp"], [B, None, HKV, a["k"].shape[3]], "[B, NC, HKV, K]")
        check_shape("v_cmp", a["v_cmp"], [B, a["k_cmp"].shape[1], HKV, a["v"].shape[3]], "[B, NC, HKV, V]")
