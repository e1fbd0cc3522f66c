"""Leaf functions of the sparse-attention and Toeplitz layers (`dsa`, `nsa`, `tmm`).

Each is a `@leaf`, so a traced layer shows one call node per core op (and per cache update)
instead of the data-dependent code inside.
Ops are imported from their subpackages: `lt2dsl.kernels.dsa` is the *subpackage* once it has been
imported, so `lt2dsl.kernels.dsa(...)` is not reliably the op.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F

from lt2dsl.kernels.dsa import dsa as dsa_op
from lt2dsl.kernels.nsa import nsa as nsa_op
from lt2dsl.kernels.toeplitz import toeplitz_mix, toeplitz_mix_step
from lt2dsl.lowering import functional as lf
from lt2dsl.lowering import packed
from lt2dsl.lowering.cache import RowPositions, StaticEntry
from lt2dsl.lowering.leaf import leaf


def check_input(x: torch.Tensor, layer: torch.nn.Module, kind: str) -> None:
    """Raise ValueError unless `x` is a `[B, T, D]` tensor (T ≥ 1) of the layer's dtype and device.

    Skipped while tracing (x is an fx Proxy): the lowered model checks its own inputs, and the
    traced graph keeps no check nodes (nor dead weight reads) between the norm and the projections.
    """
    if isinstance(x, torch.fx.Proxy):
        return
    dim, p = layer.cfg.dim, next(layer.parameters())
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != dim:
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{kind}: expected the normed block input x of shape [B, T, D={dim}], got {got}")
    if x.shape[1] < 1:
        raise ValueError(f"{kind}: expected at least one token, got x of shape {list(x.shape)}")
    if x.dtype != p.dtype:
        raise ValueError(f"{kind}: expected x of dtype {p.dtype} (the layer's weights), got {x.dtype}")
    if x.device != p.device:
        raise ValueError(f"{kind}: expected x on {p.device} (the layer's weights), got {x.device}")


@leaf
def sigmoid_gate(o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """σ(g) ⊙ o in fp32 (mixers.md §12(e)); g `[B, T, H, d]` (elementwise) or `[B, T, H, 1]` (headwise)."""
    dt = torch.float64 if o.dtype == torch.float64 else torch.float32
    return (o.to(dt) * torch.sigmoid(g.to(dt))).to(o.dtype)


@leaf
def dsa_attend(
    q,
    k,
    v,
    q_idx,
    k_idx,
    w_idx,
    topk: int,
    idx_scale: float,
    backend: str,
    pos: int | RowPositions = 0,
    cu_seqlens=None,
    w_scale: float = 1.0,
) -> torch.Tensor:
    """DSA core: causal top-k selection by the lightning indexer, attention over the selection.

    Args:
        q: `[B, Tq, H, d]` (the last Tq positions of the keys); k, v: `[B, Tk, HKV, d]`.
        q_idx: `[B, Tq, HI, dI]`; k_idx: `[B, Tk, dI]`; w_idx: `[B, Tq, HI]` (HI^{-1/2} folded in).
        topk: keys per query; idx_scale: factor inside the ReLU (dI^{-1/2}).
        pos: the queries' position (an int: they are the last Tq keys), or `RowPositions`.
        cu_seqlens: `[N + 1]` document starts of a packed row (B = 1): selection and attention
            stay inside each document.
        w_scale: multiplied into w_idx (the fusion pass moves the lowering's HI^{-1/2} here, for a
            static cache's decode step to apply it in the scoring kernel).
    Returns:
        `[B, Tq, H, d]` in the dtype of v.
    """
    if isinstance(pos, RowPositions):
        return pos.dsa(q, k, v, q_idx, k_idx, w_idx, topk, idx_scale, backend, w_scale)
    if w_scale != 1.0:
        w_idx = w_idx * w_scale
    return dsa_op(
        q, k, v, q_idx, k_idx, w_idx, topk=topk, idx_scale=idx_scale, cu_seqlens=cu_seqlens, backend=backend
    )


def n_blocks(L: int, cmp_block: int, stride: int) -> int:
    """Complete compression blocks in L tokens: n_cmp(L) = max(0, ⌊(L − l)/d⌋ + 1)."""
    return max(0, (L - cmp_block) // stride + 1)


def compress_blocks(blocks: torch.Tensor, pos_emb=None, weight=None, bias=None) -> torch.Tensor:
    """φ of blocks `[B, N, HKV, l, d]` → `[B, N, HKV, d]`: the mean over the l rows, or with
    `weight` the learned map weight · flatten(X + pos_emb) + bias (`nsa_compress`)."""
    if weight is None:
        return blocks.mean(-2)
    return F.linear((blocks + pos_emb.to(blocks.dtype)).flatten(-2), weight, bias)


@leaf
def nsa_compress(
    x: torch.Tensor,
    entry,
    key: str,
    cmp_block: int,
    stride: int,
    pos_emb: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "reference",
) -> torch.Tensor | list[torch.Tensor]:
    """Compressed keys (or values) of every complete block, updating the cache as blocks complete.

    Block i covers tokens [i·stride, i·stride + cmp_block) (0-based) and exists once all of them
    are seen: n_cmp(L) = max(0, ⌊(L − l)/d⌋ + 1) blocks after L tokens (`lt2dsl/ir/specs/nsa.py`).
    φ is mean pooling, or with `pos_emb [l, d]`, `weight [d, l·d]`, `bias [d]` the learned map
    φ(X) = weight · flatten(X + pos_emb) + bias of the block X `[l, d]` (the paper's MLP, sized by
    the spec). With an entry, only blocks completed by the new tokens are computed; `entry[key]`
    holds `[B, HKV, n_cmp, d]` (kv dtype).

    Args:
        x: `[B, L, HKV, d]` all keys (or values) so far, the cached ones and the new ones.
        cu_seqlens: `[N + 1]` document starts of a packed row (B = 1, no entry).
        backend: a static cache's decode step on "triton" (or "auto" on CUDA) writes the completed
            block in one kernel (`kernels.nsa.triton_decode.compress_step`).
    Returns:
        `[B, n_cmp(L), HKV, d]`; with `cu_seqlens` a list of one such tensor per document.
    """
    if isinstance(entry, StaticEntry):
        return entry.compress(x, key, cmp_block, stride, (pos_emb, weight, bias), backend)
    if cu_seqlens is not None:
        docs = x.split(packed.split(cu_seqlens), dim=1)
        return [nsa_compress(xd, None, key, cmp_block, stride, pos_emb, weight, bias) for xd in docs]
    B, L, HKV, d = x.shape
    old = entry[key] if entry is not None and key in entry else None
    n_old = 0 if old is None else old.shape[2]
    n_new = n_blocks(L, cmp_block, stride) - n_old
    if n_new > 0:
        # [B, n_new, HKV, d, l] -> [B, n_new, HKV, l, d]
        blocks = x[:, n_old * stride :].unfold(1, cmp_block, stride)[:, :n_new].transpose(-1, -2)
        new = compress_blocks(blocks, pos_emb, weight, bias)
    else:
        new = x.new_zeros(B, 0, HKV, d)
    if entry is None:
        return new
    if old is not None and n_new == 0:  # most decode steps: no block completed, nothing to copy
        return old.transpose(1, 2)
    full = new if old is None else torch.cat([old.transpose(1, 2), new.to(old.dtype)], dim=1)
    entry[key] = full.transpose(1, 2).detach().contiguous()
    return full


@leaf
def nsa_compress_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    entry,
    cmp_block: int,
    stride: int,
    phi_k: tuple = (),
    phi_v: tuple = (),
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "reference",
) -> tuple:
    """(`nsa_compress` of the keys into "k_cmp", of the values into "v_cmp"); `phi_k`, `phi_v`: each
    learned φ's (pos_emb, weight, bias), or () for mean pooling. A static cache's decode step on the
    Triton path compresses both in one launch."""
    if isinstance(entry, StaticEntry):
        phis = tuple(p if p else (None, None, None) for p in (phi_k, phi_v))
        return entry.compress_kv(k, v, cmp_block, stride, phis, backend)
    kw = {"cu_seqlens": cu_seqlens, "backend": backend}
    return (
        nsa_compress(k, entry, "k_cmp", cmp_block, stride, *phi_k, **kw),
        nsa_compress(v, entry, "v_cmp", cmp_block, stride, *phi_v, **kw),
    )


@leaf
def nsa_attend(
    q,
    k,
    v,
    g,
    k_cmp,
    v_cmp,
    *,
    select: int,
    block: int,
    window: int,
    cmp_block: int,
    stride: int,
    backend: str,
    pos: int | RowPositions = 0,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """NSA core: compressed, selected and sliding-window branches mixed by their gates.

    Args:
        q: `[B, Tq, H, d]`; k, v: `[B, Tk, HKV, d]`; g: `[B, Tq, H, 3]` the gates' logits (the
            branch weights are their sigmoids), ordered (cmp, slc, swa); k_cmp, v_cmp:
            `[B, NC, HKV, d]` from `nsa_compress`.
        pos: the queries' position (an int: they are the last Tq keys), or `RowPositions`.
        cu_seqlens: `[N + 1]` document starts of a packed row (B = 1); k_cmp, v_cmp are then
            lists with one tensor per document, and every document is attended alone.
    Returns:
        `[B, Tq, H, d]` in the dtype of v.
    """
    geometry = dict(select=select, block=block, window=window, cmp_block=cmp_block, stride=stride)
    if isinstance(pos, RowPositions):
        return pos.nsa(q, k, v, g, k_cmp, v_cmp, geometry, backend)
    if cu_seqlens is not None:
        parts = zip(*(t.split(packed.split(cu_seqlens), dim=1) for t in (q, k, v, g)), k_cmp, v_cmp)
        return torch.cat([nsa_attend(*p, backend=backend, **geometry) for p in parts], dim=1)
    g_cmp, g_slc, g_swa = torch.sigmoid(g).unbind(-1)
    return nsa_op(
        q,
        k,
        v,
        g_cmp,
        g_slc,
        g_swa,
        block_counts=select,
        block_size=block,
        window_size=window,
        cmp_block=cmp_block,
        cmp_stride=stride,
        k_cmp=k_cmp,
        v_cmp=v_cmp,
        backend=backend,
    )


@leaf
def toeplitz_cached(
    u: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor,
    entry,
    max_len: int,
    backend: str,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal Toeplitz mixing of `u [B, T, D]`, continuing the cached inputs when there is a cache.

    With an entry, `entry["x"]` holds the mixer inputs so far `[B, t, D]` (activation dtype): a
    fresh prefill mixes by FFT, one new token takes `toeplitz_mix_step` over the cache (O(t)), a
    chunk onto a cache mixes the whole sequence and keeps its last T outputs. A sequence past
    `max_len` raises ValueError before the cache is touched. With `cu_seqlens` (a packed row,
    no entry) every document is mixed alone, its positions starting at 0.

    Returns:
        `[B, T, D]` in the dtype of u.
    """
    if isinstance(entry, StaticEntry):
        return entry.toeplitz(u, w, bias, max_len, backend)
    if cu_seqlens is not None:
        docs = u.split(packed.split(cu_seqlens), dim=1)
        return torch.cat([toeplitz_cached(d, w, bias, None, max_len, backend) for d in docs], dim=1)
    T = u.shape[1]
    seen = entry["x"].shape[1] if entry is not None and "x" in entry else 0
    check_tmm_length(seen, T, max_len)
    if entry is None:
        return toeplitz_mix(u, w, bias, backend=backend)
    # the inputs so far, appended as a KV cache is (in place into a reserved buffer when the cache
    # has one and no gradient is recorded)
    full = lf.append_cache(entry, "x", u.detach().clone() if seen == 0 else u, dim=1)
    return toeplitz_continue(u, full, seen, w, bias, backend)


def check_tmm_length(seen: int, T: int, max_len: int) -> None:
    """Raise ValueError when T tokens after `seen` pass tmm's `max_len` (no kernel weights there)."""
    if seen + T > max_len:
        raise ValueError(
            f"tmm: the sequence reaches {seen + T} tokens (positions {seen}..{seen + T - 1}) but the "
            f"layer's max_len is {max_len}: its Toeplitz kernel has no weights past max_len"
        )


def toeplitz_continue(u: torch.Tensor, full: torch.Tensor, seen: int, w, bias, backend: str) -> torch.Tensor:
    """The outputs `[B, T, D]` of the T new inputs `u`, the last T rows of `full [B, seen + T, D]`
    (every input so far): FFT over u alone on a fresh cache, one decode step for one new token,
    else the whole sequence mixed and its last T outputs kept."""
    if seen == 0:
        return toeplitz_mix(u, w, bias, backend=backend)
    if u.shape[1] == 1:
        return toeplitz_mix_step(full, w, bias, backend=backend)[:, None].to(u.dtype)
    return toeplitz_mix(full, w, bias, backend=backend)[:, seen:].to(u.dtype)
