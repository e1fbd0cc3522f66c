"""Leaf functions of the lowered graph shared by its layers: cache plumbing, the short conv,
RoPE and the softmax-attention core.

Each is a `@leaf`, so the traced graph records one call node per use (with the cache or its entry
as an argument) instead of tracing into code that branches on whether a cache exists.
`cache_advance` is also marked side-effecting, so dead-code elimination never drops it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.node import has_side_effect

from lt2dsl.kernels import fused
from lt2dsl.lowering import packed
from lt2dsl.lowering.cache import Cache, Entry, RowPositions, StaticEntry, SubEntry
from lt2dsl.lowering.leaf import leaf

# ---- cache plumbing ------------------------------------------------------------------------------
from lt2dsl.lowering.rope_scaling import Scaling, scale_inv_freq


@leaf
def cache_entry(cache: Cache | None, k: int) -> Entry | None:
    """The entry of application k ((iteration, block) pairs counted in execution order), or None."""
    return None if cache is None else cache.entry(k)


@leaf
def sub_entry(entry: Entry | None, j: int) -> SubEntry | None:
    """Mixer j's view of a `par` block's entry, or None without a cache."""
    return None if entry is None else entry.sub(j)


@leaf
def cache_pos(cache: Cache | None) -> int | RowPositions:
    """Absolute position of the first token of this call: tokens seen so far (0 without a cache;
    per-row positions for a static cache's decode step)."""
    return 0 if cache is None else cache.position()


@has_side_effect
@leaf
def cache_advance(cache: Cache | None, T: int) -> None:
    """Count the T tokens of this call as seen (called once, after every block has run)."""
    if cache is not None:
        cache.advance(T)


# ---- the short conv, RoPE and softmax attention ------------------------------------------------


@leaf
def short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    entry,
    key: str,
    activation: str = "silu",
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Depthwise causal conv over time (mixers.md §0 ShortConv), with its decode cache.

    Args:
        x: `[B, T, C]` inputs.
        weight: `[C, 1, W]` taps (tap W−1 hits x_t); bias `[C]` or None.
        entry: cache entry or None. With an entry, `entry[key]` holds the last W−1 inputs
            `[B, C, W−1]` (zeros before the first token) and is updated in place.
        activation: "silu" or "none".
        cu_seqlens: `[N + 1]` document starts of a packed row (`x [1, T, C]`, no entry): every
            document starts from a zero history.
    Returns:
        `[B, T, C]`.
    """
    W = weight.shape[-1]
    if cu_seqlens is not None:
        xp, index = packed.pad_documents(x, cu_seqlens, W - 1)
        return short_conv(xp, weight, bias, None, key, activation)[:, index]
    xt = x.transpose(1, 2)  # [B, C, T]
    if entry is not None and key in entry:
        hist = entry[key].to(xt.dtype)
    else:
        hist = xt.new_zeros(xt.shape[0], xt.shape[1], W - 1)
    full = torch.cat([hist, xt], dim=-1)  # [B, C, W-1+T]
    if entry is not None and W > 1:
        entry[key] = full[..., full.shape[-1] - (W - 1) :].detach().clone()
    y = F.conv1d(full, weight, bias, groups=weight.shape[0])  # [B, C, T]
    y = y.transpose(1, 2)
    return F.silu(y) if activation == "silu" else y


def rope_freqs(
    dim: int,
    theta: float,
    positions: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    scaling: Scaling = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin `[T, dim/2]` of half-split RoPE (LLaMA / HF `rotate_half` convention), fp32 (or `dtype`),
    with the frequencies of `scaling` (`rope_scaling.py`)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype, device=positions.device) / dim))
    inv = scale_inv_freq(inv, scaling)
    ang = positions.to(dtype)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def rope_rows(dim: int, theta: float, positions: torch.Tensor, dtype: torch.dtype, scaling: Scaling = None):
    """(cos, cos) and (−sin, sin) side by side, `[T, dim]`: the half-split rotation is then
    x ⊙ c + rotate(x) ⊙ s with rotate(x) = (x₂, x₁), one multiply and one `addcmul`."""
    cos, sin = rope_freqs(dim, theta, positions, dtype, scaling)
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


# (dim, theta, device, dtype, scaling) -> `rope_rows` for positions 0 … n−1
_ROPE_TABLES: dict = {}


def rope_table(
    dim: int, theta: float, end: int, device: torch.device, dtype: torch.dtype, scaling: Scaling = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope_rows` `[n ≥ end, dim]` for positions 0 … n−1, cached per (dim, theta, device, dtype)
    and regrown (doubling) when `end` passes it: a decode step then slices its row instead of
    launching the small ops that compute it (×2 per attention layer and step)."""
    key = (dim, theta, str(device), dtype, scaling)
    hit = _ROPE_TABLES.get(key)
    if hit is None or hit[0].shape[0] < end:
        n = max(end, 2 * hit[0].shape[0] if hit is not None else 4096)
        # plain tensors even when first built under inference_mode: training reuses the table
        with torch.inference_mode(False), torch.no_grad():
            hit = _ROPE_TABLES[key] = rope_rows(dim, theta, torch.arange(n, device=device), dtype, scaling)
    return hit


@leaf
def apply_rope(
    x: torch.Tensor,
    pos: int | RowPositions,
    theta: float,
    scaling: Scaling = None,
    cu_seqlens: torch.Tensor | None = None,
    *,
    dims: int | None = None,
    backend: str = "reference",
) -> torch.Tensor:
    """Rotate `x [B, T, H, d]` at absolute positions pos … pos+T−1 (computed in fp32; float64 stays
    float64, so float64 tests and gradchecks see no fp32 rounding); `scaling` as in `rope_scaling.py`.
    With `cu_seqlens` (a packed row, pos 0) positions restart at 0 at every document start. Only
    the first `dims` channels of each head turn (partial RoPE; default all, 0: none). `backend`:
    the kernel backend of `kernels.fused.rope` (Triton for inference calls)."""
    return rope_heads((x,), pos, theta, scaling, cu_seqlens, dims, backend)[0]


def apply_rope_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    pos: int | RowPositions,
    theta: float,
    scaling: Scaling = None,
    cu_seqlens: torch.Tensor | None = None,
    *,
    dims: int | None = None,
    backend: str = "reference",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`apply_rope` of q `[B, T, HQ, d]` and k `[B, T, HK, d]` at the same positions: one table,
    one launch on the Triton path. Returns (q, k) rotated.

    One graph node (`rope_pair`) read by index: unpacking a traced tuple (`Proxy.__iter__`) would
    leave the tracing frames in a reference cycle, which keeps a decode cache alive past its engine.
    """
    qk = rope_pair(q, k, pos, theta, scaling, cu_seqlens, dims=dims, backend=backend)
    return qk[0], qk[1]


@leaf
def rope_pair(q, k, pos, theta: float, scaling=None, cu_seqlens=None, *, dims=None, backend="reference"):
    """The leaf of `apply_rope_qk`: (q, k) rotated."""
    return rope_heads((q, k), pos, theta, scaling, cu_seqlens, dims, backend)


def rope_heads(xs, pos, theta: float, scaling, cu_seqlens, dims: int | None, backend: str) -> tuple:
    """The rotation of `apply_rope` for tensors of one shape but the head count: the table rows
    `[B or 1, T, dims]` at their positions, then `kernels.fused.rope`."""
    x = xs[0]
    T, d = x.shape[1], x.shape[-1] if dims is None else dims
    if d == 0:
        return tuple(xs)
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    if isinstance(pos, RowPositions):
        c, s = (t[:, None, :] for t in pos.rope_rows(d, theta, dt, scaling))
    elif cu_seqlens is not None:
        c, s = _rope_at(d, theta, packed.positions(cu_seqlens, T), T, x.device, dt, scaling)
    elif torch.compiler.is_compiling():  # traced code keeps no cache of its own
        c, s = rope_rows(d, theta, torch.arange(pos, pos + T, device=x.device), dt, scaling)
    else:
        c, s = (t[pos : pos + T] for t in rope_table(d, theta, pos + T, x.device, dt, scaling))
    if c.dim() == 2:
        c, s = c[None], s[None]
    return fused.rope(xs, c, s, backend=backend)


def _rope_at(d: int, theta: float, at: torch.Tensor, end: int, device, dt, scaling) -> tuple:
    """`rope_rows` `[T, d]` at the positions `at [T]` (all below `end`)."""
    if torch.compiler.is_compiling():
        return rope_rows(d, theta, at, dt, scaling)
    c, s = rope_table(d, theta, end, device, dt, scaling)
    return c[at], s[at]


@leaf
def append_cache(entry, key: str, new: torch.Tensor, dim: int = 2, keep: int | None = None) -> torch.Tensor:
    """Append `new` to `entry[key]` along `dim` (creating it) and return the whole cached tensor.

    With `keep`, only the last `keep` positions stay cached (sliding-window ring), but the
    returned tensor still holds the previous window plus all of `new`, which is what a query
    block of length T needs to see its window. Without an entry, returns `new` unchanged.
    Without `keep`, in a cache with a reserve and with no gradient to carry, tokens are written
    in place into a buffer reserved for that many tokens (`cache.py`): no copy of the cache.
    """
    if entry is None:
        return new
    if isinstance(entry, StaticEntry):
        return entry.append(key, new, dim, keep)
    # In-place writes only where no autograd graph can have saved the cache (any grad-enabled call
    # may have: attention saves k, v for q's gradient even when k, v need none).
    if keep is None and entry.reserve and not torch.is_grad_enabled():
        return _append_reserved(entry, key, new, dim)
    entry.buffers.pop(key, None)  # the copy below replaces what a reserved buffer held
    full = torch.cat([entry[key], new.to(entry[key].dtype)], dim=dim) if key in entry else new
    stored = (
        full if keep is None else full.narrow(dim, max(0, full.shape[dim] - keep), min(keep, full.shape[dim]))
    )
    # a view (the new tokens slice a projection's output) would keep its whole base alive
    stored = stored.detach()
    entry[key] = stored.clone() if keep is not None or stored._base is not None else stored
    return full


def _append_reserved(entry, key: str, new: torch.Tensor, dim: int) -> torch.Tensor:
    """`append_cache` into the entry's reserved buffer; past the reserve it grows to fit exactly.

    A grad-enabled call replaces the cached tensor by a copy and drops the buffer (`append_cache`),
    so a buffer present here is the one `entry[key]` views; one made under inference mode is not
    written outside it. The buffer's mode is recorded at allocation: `torch.compile` can trace
    neither a storage-pointer comparison nor `Tensor.is_inference()`.
    """
    n = entry[key].shape[dim] if key in entry else 0
    T = new.shape[dim]
    held = entry.buffers.get(key)  # (buffer, allocated under inference mode) or None
    # Dynamo traces no inference-mode query (and compiled code runs under no_grad, not inference)
    inference = not torch.compiler.is_compiling() and torch.is_inference_mode_enabled()
    buf = None if held is None or n == 0 or (held[1] and not inference) else held[0]
    if buf is None or buf.shape[dim] < n + T:
        shape = list(new.shape)
        shape[dim] = max(n + T, entry.reserve)
        grown = new.new_empty(shape, dtype=entry[key].dtype if n else new.dtype)
        if n:
            grown.narrow(dim, 0, n).copy_(entry[key])
        buf = grown
        entry.buffers[key] = (buf, inference)
    buf.narrow(dim, n, T).copy_(new)
    entry[key] = full = buf.narrow(dim, 0, n + T)
    return full


@leaf
def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int | None,
    gate: torch.Tensor | None,
    backend: str,
    pos: int | RowPositions = 0,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal softmax attention through `lt2dsl.kernels.attention` (one graph node).

    Args:
        q: `[B, Tq, HQ, d]` rotated queries; they are the last Tq positions of the keys.
        k, v: `[B, Tk, HKV, d]` rotated keys / values (cached ones first).
        window: sliding window w (keys including the query's own), or None for full attention.
        gate: pre-sigmoid output gate `[B, Tq, HQ, d]` or `[B, Tq, HQ]`, or None.
        backend: "reference", "triton" or "auto".
        pos: the queries' position (an int: they are the last Tq keys), or `RowPositions`.
        cu_seqlens: `[N + 1]` document starts of a packed row (B = 1): no attention across them.
    Returns:
        `[B, Tq, HQ, d]` in the dtype of `v`.
    """
    if isinstance(pos, RowPositions):
        return pos.attention(q, k, v, window, gate, backend)
    # From the op's subpackage: `lt2dsl.kernels.attention` is the subpackage once imported.
    from lt2dsl.kernels.attention import attention

    return attention(q, k, v, causal=True, window=window, gate=gate, cu_seqlens=cu_seqlens, backend=backend)
