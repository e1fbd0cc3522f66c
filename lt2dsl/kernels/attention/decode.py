"""`attention_decode`: a few new queries against a KV cache (linear or sliding-window ring buffer).

Cache conventions (per batch row b, `n = cache_seqlens[b]` tokens so far, the new ones included,
already written into the cache by the caller):

* linear (`ring=False`): slot j holds position j; slots j ≥ n are ignored.
* ring (`ring=True`, the sliding-window cache of mixers.md §9(c)): an `L`-slot buffer where position p
  was written to slot p % L; slot j therefore holds position n − 1 − ((n − 1 − j) mod L) when that is
  ≥ 0. Keys are stored already rotated (RoPE at their absolute position). With `window = w`, every
  query needs L ≥ w + Tq − 1 so that no key it sees has been overwritten.

The new queries are the last `Tq` positions: query i sits at n − Tq + i. Softmax is order-free, so
the ring needs no reordering: only each slot's position enters, through the causal/window mask.
"""

from __future__ import annotations

import torch

from ..common.attn_utils import compute_dtype, repeat_kv
from ..common.backend import check_shape, resolve_backend


def attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    window: int | None = None,
    ring: bool = False,
    gate: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "reference",
) -> torch.Tensor:
    """Causal attention of `Tq` new queries over a cache (flash-decoding split over the cache on GPU).

    Args:
        q (torch.Tensor): `[B, Tq, HQ, K]` new queries (Tq small: 1 for decode).
        k_cache (torch.Tensor): `[B, L, HKV, K]` cached keys (linear cache or ring buffer).
        v_cache (torch.Tensor): `[B, L, HKV, V]`.
        cache_seqlens (torch.Tensor): `[B]` integer count of tokens so far, new ones included.
        window (int, Optional): sliding window w (keys p − w + 1 … p). Default: `None`.
        ring (bool, Optional): the cache is an `L`-slot ring buffer (module docstring). Default: `False`.
        gate (torch.Tensor, Optional): pre-sigmoid logits `[B, Tq, HQ, V]` or `[B, Tq, HQ]`.
        scale (float, Optional): default `K ** -0.5`.
        backend (str, Optional): "reference", "triton" or "auto". Default: "reference".

    Returns:
        o (torch.Tensor): `[B, Tq, HQ, V]` in the dtype of `v_cache`.
    """
    check_shape("q", q, [None] * 4, "[B, Tq, HQ, K]")
    B, Tq, HQ, K = q.shape
    check_shape("k_cache", k_cache, [B, None, None, K], "[B, L, HKV, K]")
    L, HKV = k_cache.shape[1:3]
    check_shape("v_cache", v_cache, [B, L, HKV, None], "[B, L, HKV, V]")
    check_shape("cache_seqlens", cache_seqlens, [B], "[B]")
    if HQ % HKV:
        raise ValueError(f"query heads HQ={HQ} must be a multiple of kv heads HKV={HKV}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if gate is not None and gate.shape not in ((B, Tq, HQ), (B, Tq, HQ, v_cache.shape[-1])):
        raise ValueError(f"`gate` must have shape [B, Tq, HQ] or [B, Tq, HQ, V], got {list(gate.shape)}")
    scale = K**-0.5 if scale is None else float(scale)
    if resolve_backend(backend, q) == "triton":
        from .ops import attn_decode_op

        return attn_decode_op(
            q,
            k_cache,
            v_cache,
            cache_seqlens,
            None if gate is None else gate.contiguous(),
            scale,
            window or 0,
            ring,
        )
    return attention_decode_reference(
        q, k_cache, v_cache, cache_seqlens, window=window, ring=ring, gate=gate, scale=scale
    )


def slot_positions(cache_seqlens: torch.Tensor, L: int, ring: bool) -> torch.Tensor:
    """Absolute position held by each cache slot, `[B, L]`; −1 for an empty slot."""
    n = cache_seqlens.to(torch.int64)[:, None]
    j = torch.arange(L, device=cache_seqlens.device)[None, :]
    pos = n - 1 - torch.remainder(n - 1 - j, L) if ring else j.expand(n.shape[0], L)
    return torch.where((pos >= 0) & (pos < n), pos, torch.full_like(pos, -1))


def decode_mask(cache_seqlens: torch.Tensor, Tq: int, L: int, window, ring: bool) -> torch.Tensor:
    """`[B, Tq, L]` visibility of each slot to each new query."""
    pos = slot_positions(cache_seqlens, L, ring)[:, None, :]
    qpos = cache_seqlens.to(torch.int64)[:, None, None] - Tq + torch.arange(Tq, device=pos.device)[:, None]
    mask = (pos >= 0) & (pos <= qpos)
    if window is not None:
        mask &= pos >= qpos - window + 1
    return mask


def attention_decode_reference(q, k_cache, v_cache, cache_seqlens, *, window, ring, gate, scale):
    """Dense masked form of `attention_decode` (fp32, float64 for float64 inputs)."""
    Tq, HQ = q.shape[1:3]
    L, HKV = k_cache.shape[1:3]
    dt = compute_dtype(q, k_cache, v_cache)
    kx, vx = (repeat_kv(x, HQ // HKV).to(dt) for x in (k_cache, v_cache))
    s = torch.einsum("bihk,bjhk->bhij", q.to(dt) * scale, kx)
    mask = decode_mask(cache_seqlens, Tq, L, window, ring)
    p = torch.softmax(s.masked_fill(~mask[:, None], float("-inf")), dim=-1)
    o = torch.einsum("bhij,bjhv->bihv", torch.nan_to_num(p, nan=0.0), vx)
    if gate is not None:
        g = torch.sigmoid(gate.to(dt))
        o = o * (g if g.dim() == 4 else g[..., None])
    return o.to(v_cache.dtype)
