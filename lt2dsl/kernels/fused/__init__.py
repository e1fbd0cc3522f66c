"""Fused ops of the FX fusion pass (`lt2dsl.lowering.fx_passes`): one function per fused op.

Each takes `backend=` like the mixer ops ("reference" | "triton" | "auto"): "reference" runs
`naive.py` (the unfused math, float64-capable, differentiable by autograd); "triton" runs the
custom ops of `ops.py` (Triton forward and backward kernels); "auto" picks Triton on CUDA. Where
the Triton kernels do not apply (float64, mismatched shapes) the reference runs instead, so a
fused graph computes what the unfused one does on every input.

| op | replaces | Triton launches (fwd / bwd) |
|---|---|---|
| `add_rmsnorm(x, r, γ, eps)` → (normed, sum) | `h + y` then `nn.RMSNorm` | 1 / 1 (+ dγ sum) |
| `norm_add_rmsnorm(x, y, γ₁, ε₁, γ₂, ε₂)` | a sandwich's `nn.RMSNorm`, `h + y`, `nn.RMSNorm` | 1 / unfused |
| `linear_split(x, W_cat, b_cat, sizes)` | several `nn.Linear` of one input | one GEMM (cuBLAS) |
| `conv_silu(x, w, b, hist, head_dim)` | `short_conv` (+ the core's q/k L2Norm) | 1 / 2 (+ dw sum) |
| `conv_silu_step(xs, ws, bs, hists, hds)` | ≤ 3 convs' decode steps, their history updates | 1 / none |
| `gdn_gate(a, b, A_log, dt_bias)` → (g, β) | exp, neg, softplus, add, sigmoid, casts | 1 / 1 |
| `gated_rmsnorm_linear(o, g, γ, W, b)` | `GatedRMSNorm` then flatten, `o_proj` | 1 + GEMM / 2 + 2 GEMMs |
| `swiglu(a, b)` | `silu(a) * b` | 1 / 1 |
| `rope((q, k), c, s)` | casts, cat, mul, addcmul (+ the partial-RoPE cat), per tensor | 1 / none |
| `xpos((q, k), cos, sin, pos)` | the angle table, casts, pair products, stack, per tensor | 1 / none |
| `mamba2_gate(a, x, A_log, dt_bias)` → (v, g) | casts, add, softplus, exp, neg, mul, dt · x | 1 / none |
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from lt2dsl.kernels.common.backend import TRITON_DTYPES, resolve_backend

from . import naive
from .common import rows_view

__all__ = [
    "add_rmsnorm",
    "concat_biases",
    "concat_weights",
    "conv_silu",
    "conv_silu_step",
    "gated_rmsnorm_linear",
    "gdn_gate",
    "linear_split",
    "mamba2_gate",
    "norm_add_rmsnorm",
    "rope",
    "rope_cache",
    "swiglu",
    "xpos",
]


def use_triton(backend: str, *tensors: torch.Tensor | None) -> bool:
    """Triton for this call: the backend resolves to it and every tensor is fp32/bf16/fp16."""
    ref = next(t for t in tensors if t is not None)
    if resolve_backend(backend, ref) != "triton":
        return False
    return all(t is None or t.dtype in TRITON_DTYPES for t in tensors)


_OPS = None


def _ops():
    # registers the custom ops on first use (importing Triton only when a kernel runs); kept, so a
    # decode step's ~700 fused-op calls skip the import machinery
    global _OPS
    if _OPS is None:
        from . import ops

        _OPS = ops
    return _OPS


def add_rmsnorm(
    x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor | None, eps: float | None, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add and the next RMSNorm: (RMSNorm(x + r) · γ, x + r), one kernel.

    Args:
        x, r: `[..., D]` the residual stream and the branch output.
        weight: `[D]` the norm's γ (None: no affine weight); eps: the norm's eps (None: dtype eps).
    Returns:
        (normed, sum), both `[..., D]` in x's dtype.
    """
    same = x.shape == r.shape and x.dtype == r.dtype and weight is not None
    if not (same and use_triton(backend, x, r, weight)):
        return naive.add_rmsnorm_ref(x, r, weight, eps)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    n, s, _ = _ops().add_rmsnorm_op(x, r, weight, eps)
    return n, s


def norm_add_rmsnorm(
    x: torch.Tensor,
    y: torch.Tensor,
    w1: torch.Tensor,
    eps1: float | None,
    w2: torch.Tensor,
    eps2: float | None,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sandwich block's residual add: the branch y normed, added, the sum normed; one kernel.

    Args:
        x, y: `[..., D]` the residual stream and the branch output (before its norm).
        w1, eps1: the branch norm's γ₁ and eps; w2, eps2: the next norm's (None eps: dtype eps).
    Returns:
        (RMSNorm(s) · γ₂, s) with s = x + RMSNorm(y) · γ₁, both in x's dtype. The kernel has no
        backward: a call autograd must record runs the branch norm and `add_rmsnorm`.
    """
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, y, w1, w2))
    same = x.shape == y.shape and x.dtype == y.dtype and w1.shape == w2.shape == x.shape[-1:]
    if grad or not (same and use_triton(backend, x, y, w1, w2)):
        return add_rmsnorm(x, F.rms_norm(y, (y.shape[-1],), w1, eps1), w2, eps2, backend=backend)
    finfo = torch.finfo(x.dtype).eps
    e1, e2 = finfo if eps1 is None else eps1, finfo if eps2 is None else eps2
    return _ops().norm_add_rmsnorm_op(x, y, w1, e1, w2, e2)


# attribute of the first weight holding (key of all weights and versions, their concatenation)
_CAT_ATTR = "_lt2_concat_cache"


# The concatenated output dim is padded to a multiple of this many rows, so the GEMM output's row
# stride is a multiple of 16 elements: cuBLAS keeps its aligned kernels, and Triton kernels reading
# the slices in place can prove the stride 16-divisible and vectorise. (DSA's q, k, v, indexer q, k
# and weights add up to 6468 columns at dim 2048; its fused block ran 1.5x slower than the unfused
# one on the H200 both unpadded and padded to 8. Padding to 16 is not measured.)
CAT_ALIGN = 16


def _pad_rows(n: int) -> int:
    return (-n) % CAT_ALIGN


def concat_weights(*ws: torch.Tensor) -> torch.Tensor:
    """`torch.cat(ws)` along the output dim, built from the original parameters (their gradients
    flow back through the cat), padded with zero rows to a multiple of CAT_ALIGN. Without autograd
    (eval, decode) the result is cached until any of the parameters changes (in-place version
    counter), so a decode step does not copy weights; a call with autograd drops the cached copy."""
    if torch.compiler.is_compiling():
        return _padded_cat(ws)
    if torch.is_grad_enabled():
        ws[0].__dict__.pop(_CAT_ATTR, None)
        return _padded_cat(ws)
    key = tuple((id(w), w._version, w.data_ptr()) for w in ws)
    hit = ws[0].__dict__.get(_CAT_ATTR)
    if hit is not None and hit[0] == key:
        return hit[1]
    out = _padded_cat(ws)
    ws[0].__dict__[_CAT_ATTR] = (key, out)
    return out


def _padded_cat(ws: Sequence[torch.Tensor]) -> torch.Tensor:
    pad = _pad_rows(sum(w.shape[0] for w in ws))
    parts = [*ws, ws[0].new_zeros(pad, *ws[0].shape[1:])] if pad else list(ws)
    return torch.cat(parts, dim=0)


def concat_biases(sizes: Sequence[int], *bs: torch.Tensor | None) -> torch.Tensor:
    """The biases of concatenated projections; a projection without one contributes zeros (and
    the padding of `concat_weights` zeros too). Cached without autograd as `concat_weights` is,
    so a decode step launches nothing for it."""
    ref = next(b for b in bs if b is not None)
    if torch.compiler.is_compiling():
        return _bias_cat(sizes, bs, ref)
    if torch.is_grad_enabled():
        ref.__dict__.pop(_BIAS_CAT_ATTR, None)
        return _bias_cat(sizes, bs, ref)
    key = (tuple(sizes), *((id(b), b._version, b.data_ptr()) if b is not None else None for b in bs))
    hit = ref.__dict__.get(_BIAS_CAT_ATTR)
    if hit is not None and hit[0] == key:
        return hit[1]
    out = _bias_cat(sizes, bs, ref)
    ref.__dict__[_BIAS_CAT_ATTR] = (key, out)
    return out


_BIAS_CAT_ATTR = "_lt2_bias_concat_cache"


def _bias_cat(sizes: Sequence[int], bs: Sequence[torch.Tensor | None], ref: torch.Tensor) -> torch.Tensor:
    parts = [b if b is not None else ref.new_zeros(n) for b, n in zip(bs, sizes)]
    pad = _pad_rows(sum(sizes))
    return torch.cat([*parts, ref.new_zeros(pad)] if pad else parts, dim=0)


def linear_split(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, sizes: Sequence[int]
) -> tuple[torch.Tensor, ...]:
    """Several projections of one input as one GEMM: `F.linear(x, W_cat, b_cat).split(sizes, -1)`.

    The outputs are column slices (views) of one `[..., Σ sizes + pad]` tensor; the padding
    columns of `concat_weights` are dropped.
    """
    pad = weight.shape[0] - sum(sizes)
    parts = F.linear(x, weight, bias).split([*sizes, pad] if pad else list(sizes), dim=-1)
    return parts[: len(sizes)]


def conv_silu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    hist: torch.Tensor | None,
    *,
    head_dim: int = 0,
    backend: str = "auto",
) -> torch.Tensor:
    """Causal depthwise short conv + SiLU (+ L2Norm per head of `head_dim` channels), one kernel.

    Args:
        x: `[B, T, C]`; weight `[C, 1, W]`; bias `[C]` or None.
        hist: `[B, C, W−1]` the inputs before x (a decode cache), or None for zeros.
        head_dim: L2-normalise groups of this many channels after the SiLU (0: none).
    Returns:
        `[B, T, C]` in x's dtype.
    """
    W = weight.shape[-1]
    ok = W > 1 and (not head_dim or head_dim <= 256) and use_triton(backend, x, weight, bias, hist)
    if not ok:
        return naive.conv_silu_ref(x, weight, bias, hist, head_dim)
    w2 = weight.reshape(weight.shape[0], W).contiguous()
    return _ops().conv_silu_op(x, w2, bias, None if hist is None else hist.detach(), head_dim)


def conv_silu_step(
    xs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    hists: Sequence[torch.Tensor],
    *,
    head_dims: Sequence[int],
    backend: str = "auto",
) -> tuple[torch.Tensor, ...]:
    """One decode token through up to three short convs (+ SiLU, + L2Norm per head), one kernel;
    each history takes its x as newest input, in place (no autograd: decode only).

    Args:
        xs: `[B, 1, C_i]` the new inputs; weights `[C_i, 1, W]` (one W); biases `[C_i]` or None.
        hists: `[B, C_i, W−1]` the inputs before x, in x's dtype; overwritten with the last W−1.
        head_dims: per conv, L2-normalise groups of this many channels after the SiLU (0: none).
    Returns:
        the ys `[B, 1, C_i]` in x's dtype.
    """
    n = len(xs)
    if not (1 <= n <= 3 and len(weights) == len(biases) == len(hists) == len(head_dims) == n):
        raise ValueError(f"conv_silu_step takes 1 to 3 convs, each with its weight, bias, history; got {n}")
    W = weights[0].shape[-1]
    if W < 2 or any(x.shape[1] != 1 for x in xs) or any(w.shape[-1] != W for w in weights):
        raise ValueError("conv_silu_step takes x `[B, 1, C]` (one token per row) and convs of one width ≥ 2")
    if not _step_on_triton(xs, hists, head_dims, backend, (*weights, *biases)):
        return naive.conv_silu_step_ref(list(xs), list(weights), list(biases), list(hists), list(head_dims))
    w2s = [w.reshape(w.shape[0], W).contiguous() for w in weights]
    x2s = [x.reshape(x.shape[0], x.shape[2]) for x in xs]
    h0, h1, h2 = [h.detach() for h in hists] + [None] * (3 - n)
    ys = _ops().conv_silu_step_op(x2s, w2s, list(biases), h0, h1, h2, list(head_dims))
    return tuple(y.view(x.shape) for x, y in zip(xs, ys[:n]))


def _step_on_triton(xs, hists, head_dims, backend: str, params) -> bool:
    """Whether `conv_silu_step` runs its kernel: Triton for these tensors, x and its history of one
    dtype with unit channel / time strides, one L2 head width ≤ 256."""
    heads = {d for d in head_dims if d}
    if len(heads) > 1 or max(heads, default=0) > 256:
        return False
    for x, h in zip(xs, hists):
        if h.dtype != x.dtype or h.shape[:2] != (x.shape[0], x.shape[2]):
            return False
        if x.stride(-1) != 1 or h.stride(-1) != 1:
            return False
    return use_triton(backend, *xs, *hists, *params)


def gdn_gate(
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    beta_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN gates from the raw projections, one kernel (mixers.md §5(a)).

    g = −exp(A_log) · softplus(a + dt_bias), β = beta_scale · σ(b), both `[B, T, HV]` in `dtype`
    (fp32; float64 for float64 models). a, b `[B, T, HV]`; A_log, dt_bias `[HV]`.
    """
    HV = a.shape[-1]
    ok = (
        dtype == torch.float32
        and b.shape == a.shape
        and A_log.shape == (HV,)
        and dt_bias.shape == (HV,)
        and use_triton(backend, a, b, A_log, dt_bias)
    )
    if not ok:
        return naive.gdn_gate_ref(a, b, A_log, dt_bias, beta_scale, dtype)
    g, beta = _ops().gdn_gate_op(rows_view(a, HV), rows_view(b, HV), A_log, dt_bias, float(beta_scale))
    return g.view(a.shape), beta.view(a.shape)


ACT_CODES = {None: 0, "silu": 1, "sigmoid": 2}


def gated_rmsnorm_linear(
    o: torch.Tensor,
    gate: torch.Tensor | None,
    norm_weight: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor | None,
    *,
    eps: float,
    act: str | None,
    group: int,
    norm_before_gate: bool = True,
    n_flat: int = 1,
    backend: str = "auto",
) -> torch.Tensor:
    """A mixer's output norm and projection: `proj(GatedRMSNorm(o, gate).flatten(-n_flat))`.

    Args:
        o: `[..., dim]` the core output (dim = norm_weight's length, `group` divides it).
        gate: same shape as o, the gate pre-activation (ignored when `act` is None).
        act: "silu", "sigmoid" or None; norm_before_gate: fla's RMSNorm(o) ⊙ act(g) (True) or
            Mamba2's RMSNorm(o ⊙ act(g)) (False).
        n_flat: how many trailing dims of o the projection reads flattened (its in_features).
    Returns:
        `[*o.shape[:-n_flat], D]` in the norm weight's dtype. The Triton path recomputes the
        normed activations in the backward instead of keeping them.
    """
    gate = gate if act is not None else None
    L = proj_weight.shape[1]
    lead = o.shape[: o.dim() - n_flat]
    ok = (
        o.shape[o.dim() - n_flat :].numel() == L
        and L % norm_weight.shape[0] == 0
        and norm_weight.shape[0] % group == 0
        and (gate is None or gate.shape == o.shape)
        and o.dtype == norm_weight.dtype == proj_weight.dtype
        and use_triton(backend, o, gate, norm_weight, proj_weight, proj_bias)
    )
    if not ok:
        return naive.gated_rmsnorm_linear_ref(
            o, gate, norm_weight, proj_weight, proj_bias, eps, act, group, norm_before_gate, n_flat
        )
    o2 = rows_view(o, L)
    g2 = None if gate is None else rows_view(gate, L)
    out = _ops().gated_rmsnorm_linear_op(
        o2,
        g2,
        norm_weight,
        proj_weight,
        proj_bias,
        float(eps),
        ACT_CODES[act],
        group,
        norm_before_gate or act is None,
    )
    return out.view(*lead, proj_weight.shape[0])


def swiglu(a: torch.Tensor, b: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """SiLU(a) ⊙ b, one kernel forward and one backward. a, b `[..., F]` of one shape and dtype."""
    if not (a.shape == b.shape and a.dtype == b.dtype and a.dim() >= 1 and use_triton(backend, a, b)):
        return naive.swiglu_ref(a, b)
    F_ = a.shape[-1]
    return _ops().swiglu_op(rows_view(a, F_), rows_view(b, F_)).view(a.shape)


def rope(
    xs: Sequence[torch.Tensor], c: torch.Tensor, s: torch.Tensor, *, backend: str = "auto"
) -> tuple[torch.Tensor, ...]:
    """Half-split RoPE of one or two tensors sharing a table (q and k), one kernel for both.

    Args:
        xs: `[B, T, H_i, D]` (one B, T, D); the first R channels of each head turn, the rest stay.
        c, s: `[B or 1, T, R]` rows of `lowering.functional.rope_rows` (R even, ≤ D), fp32 (or
            float64, which runs the reference).
    Returns:
        the ys in the xs' dtypes. The kernel has no backward: a call autograd must record runs the
        reference (`naive.rope_ref`).
    """
    if not (1 <= len(xs) <= 2 and _rope_on_triton(xs, c, s, backend)):
        return tuple(naive.rope_ref(x, c, s) for x in xs)
    ys = _ops().rope_op(xs[0], xs[1] if len(xs) > 1 else None, c, s)
    return ys[: len(xs)]


def _rope_on_triton(xs, c: torch.Tensor, s: torch.Tensor, backend: str) -> bool:
    """The kernel's case: no autograd to record, the table fp32 with c's strides, unit channel strides."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return False
    B, T, _, D = xs[0].shape
    if any(x.shape[0] != B or x.shape[1] != T or x.shape[3] != D or x.stride(-1) != 1 for x in xs):
        return False
    if c.dtype != torch.float32 or s.dtype != c.dtype or s.shape != c.shape or s.stride() != c.stride():
        return False
    return c.shape[0] in (1, B) and c.shape[1] == T and c.stride(-1) == 1 and use_triton(backend, *xs)


def rope_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, c: torch.Tensor, s: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor | None, positions: torch.Tensor, *, ring: bool = False,
    norm: tuple | None = None, backend: str = "auto",
) -> torch.Tensor:  # fmt: skip
    """A decode step's RoPE with its cache writes, one kernel: q turned; k (LayerNorm-ed first with
    `norm`) turned and v copied into their caches at each row's slot.

    Args:
        q: `[B, 1, Hq, D]`; k, v `[B, 1, Hk, D]` (v may be None).
        c, s: `[B, R]` table rows at each row's position (`RowPositions.rope_rows`), fp32.
        k_cache, v_cache: `[B, Hk, L, D]` views of the cache buffers, written in place.
        positions: `[B]` int64, each row's position; its slot, mod L with `ring`.
        norm: (weight, bias `[D]`, eps) of a LayerNorm over k's channels, or None.
    Returns:
        q turned, in q's dtype (`naive.rope_cache_ref`).
    """
    if not _rope_cache_on_triton(q, k, v, c, s, k_cache, v_cache, norm, backend):
        return naive.rope_cache_ref(q, k, v, c, s, k_cache, v_cache, positions, ring, norm)
    w, b, eps = norm if norm is not None else (None, None, 0.0)
    return _ops().rope_cache_op(q, k, v, c, s, k_cache, v_cache, positions, ring, w, b, float(eps))


def _rope_cache_on_triton(q, k, v, c, s, k_cache, v_cache, norm, backend: str) -> bool:
    """The kernel's case: no autograd, one token per row, one head dim, unit channel strides, an fp32
    table of one stride pattern, caches of k's layout, a LayerNorm with weight and bias."""
    tensors = [q, k, c, s, k_cache] + ([v, v_cache] if v is not None else [])
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    B, _, _, D = q.shape
    if any(t.shape[0] != B or t.shape[-1] != c.shape[-1] for t in (c, s)) or c.dim() != 2:
        return False
    if c.dtype != torch.float32 or s.dtype != c.dtype or s.stride() != c.stride() or c.stride(-1) != 1:
        return False
    pairs = [(k, k_cache)] + ([(v, v_cache)] if v is not None else [])
    for x, cache in pairs:
        if x.shape != (B, 1, k.shape[2], D) or cache.dim() != 4 or cache.shape[:2] != (B, k.shape[2]):
            return False
        if cache.shape[3] != D or x.stride(-1) != 1 or cache.stride(-1) != 1 or cache.dtype != x.dtype:
            return False
    if q.shape[1] != 1 or q.stride(-1) != 1 or (norm is not None and (norm[0] is None or norm[1] is None)):
        return False
    return use_triton(backend, q, k, v)


def xpos(
    xs: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, *,
    backend: str = "auto",
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """RetNet's interleaved-pair rotation of one or two tensors at positions (q and k), one kernel.

    Args:
        xs: `[B, T, H_i, D]` (one B, T, D; D even).
        cos, sin: `[P, D/2]` the angle tables at positions 0 … P−1
            (`lowering.functional_recurrent.xpos_angles`), fp32 (or float64, which runs the reference).
        positions: `[T]` (shared by the rows) or `[B, T]` int64 rows of the tables, each below P.
    Returns:
        the ys in the xs' dtypes (`naive.xpos_ref`). The kernel has no backward: a call autograd
        must record runs the reference.
    """
    if not (1 <= len(xs) <= 2 and _xpos_on_triton(xs, cos, sin, positions, backend)):
        return tuple(naive.xpos_ref(x, cos, sin, positions) for x in xs)
    ys = _ops().xpos_op(xs[0], xs[1] if len(xs) > 1 else None, cos, sin, positions)
    return ys[: len(xs)]


def _xpos_on_triton(xs, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, backend: str) -> bool:
    """The kernel's case: no autograd to record, even D with unit channel strides, contiguous fp32
    tables `[P, D/2]`, integer positions `[T]` or `[B, T]`."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return False
    B, T, _, D = xs[0].shape
    if D % 2 or any(x.shape[0] != B or x.shape[1] != T or x.shape[3] != D or x.stride(-1) != 1 for x in xs):
        return False
    if cos.dtype != torch.float32 or sin.dtype != cos.dtype or cos.shape != sin.shape or cos.dim() != 2:
        return False
    if cos.shape[1] != D // 2 or not (cos.is_contiguous() and sin.is_contiguous()):
        return False
    if positions.dtype not in (torch.int32, torch.int64) or positions.shape not in ((T,), (B, T)):
        return False
    return use_triton(backend, *xs)


def mamba2_gate(
    a: torch.Tensor, x: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, *,
    dtype: torch.dtype = torch.float32, backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Mamba2's gates from the raw dt projection, one kernel (mixers.md §7(a)).

    dt = softplus(a + dt_bias); v = dt · x rounded to x's dtype, the core's value; g = dt · (−exp(A_log))
    `[B, T, H]` in `dtype`, its log decay. a `[B, T, H]`; x `[B, T, H, P]`; A_log, dt_bias `[H]`.
    The kernel has no backward: a call autograd must record runs the reference
    (`naive.mamba2_gate_ref`), as does a gate dtype other than fp32.
    """
    H = a.shape[-1]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (a, x, A_log, dt_bias))
    ok = (
        not grad
        and dtype == torch.float32
        and x.dim() == 4
        and x.shape[:3] == a.shape
        and A_log.shape == dt_bias.shape == (H,)
        and use_triton(backend, a, x, A_log, dt_bias)
    )
    if not ok:
        return naive.mamba2_gate_ref(a, x, A_log, dt_bias, dtype)
    P = x.shape[-1]
    x3 = x.reshape(-1, H, P)
    x3 = x3 if x3.stride(-1) == 1 else x3.contiguous()
    v, g = _ops().mamba2_gate_op(rows_view(a, H), x3, A_log, dt_bias)
    return v.view(x.shape), g.view(a.shape)
