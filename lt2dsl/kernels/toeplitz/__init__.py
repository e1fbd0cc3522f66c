"""`toeplitz_mix`: the causal Toeplitz token mixer of TMM (mixers.md §13).

y_t = Σ_{s ≤ t} w[t − s] x_s + b[t] per channel, with one kernel shared by all channels (w `[n]`),
one per head (w `[heads, n]`, channels split into equal groups) or the kernel variant
(w `[kernel, heads, n]`: output channel c mixes input channels c − k + 1 … c, zero-padded below 0,
with the kernels of c's own head; the window reads across head boundaries, as §13(a)'s formula
does). n is the maximum length. Files: `naive.py` (dense masked product and the step form, the truth),
`fft_ref.py` (FFT in PyTorch), `fft_fast.py` (cuFFT with fused Triton pre/post passes),
`blocked.py` (16-bit inputs: blocked DFTs on tensor cores; `blocked_ref.py` is its math, `recipe.py`
its variants, `launch.py` its launches), `decode.py`
(Triton step kernel), `ops.py` (torch.library registration). Decode: `toeplitz_mix_step` over the
cached inputs, O(t) per token.
"""

from __future__ import annotations

import torch

from ..common.backend import check_float, check_shape, check_triton_dtype, pick_backend
from .blocked_ref import block_size
from .fft_ref import fft_size, fft_toeplitz_mix
from .naive import naive_toeplitz_mix, toeplitz_step_ref
from .recipe import pick

METHODS = ("auto", "fft", "blocked")

__all__ = [
    "fft_size",
    "fft_toeplitz_mix",
    "naive_toeplitz_mix",
    "normalize_weights",
    "toeplitz_mix",
    "toeplitz_mix_step",
    "toeplitz_step_ref",
]


def normalize_weights(
    w: torch.Tensor, bias: torch.Tensor | None, C: int, T: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Bring w to `[kernel, heads, n]` and bias to `[heads, n]` (or None), checking every size.

    Args:
        w (torch.Tensor): `[n]`, `[heads, n]` or `[kernel, heads, n]`.
        bias (torch.Tensor, Optional): `[n]` or `[heads, n]` (a single row is shared by all heads).
        C (int): channels of x; must be divisible by heads.
        T (int): sequence length; must be ≤ n (max_len).

    Returns:
        w3 (torch.Tensor): `[kernel, heads, n]` (a view).
        b2 (torch.Tensor or None): `[heads, n]` (a view or an expansion).
    """
    if not isinstance(w, torch.Tensor) or w.dim() not in (1, 2, 3):
        raise ValueError("`w` must have shape [n], [heads, n] or [kernel, heads, n]")
    check_float("w", w)
    w3 = w.view(1, 1, -1) if w.dim() == 1 else (w.unsqueeze(0) if w.dim() == 2 else w)
    _, heads, n = w3.shape
    if n < T:
        raise ValueError(f"sequence length T={T} exceeds the mixer's max_len n={n} (w is [..., n])")
    b2 = _normalize_bias(bias, n)
    if b2 is not None and b2.shape[0] not in (1, heads):
        if heads != 1:
            raise ValueError(
                f"`bias` must have shape [n] or [heads, n] = [{heads}, {n}], got {list(bias.shape)}"
            )
        heads = b2.shape[0]
        w3 = w3.expand(w3.shape[0], heads, n)
    if b2 is not None and b2.shape[0] != heads:
        b2 = b2.expand(heads, n)
    if heads < 1 or C % heads != 0:
        raise ValueError(f"channels C={C} must be divisible by heads={heads} (w is [kernel, heads, n])")
    return w3, b2


def _normalize_bias(bias: torch.Tensor | None, n: int) -> torch.Tensor | None:
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or bias.dim() not in (1, 2) or bias.shape[-1] != n:
        got = list(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise ValueError(f"`bias` must have shape [n] or [heads, n] with n={n}, got {got}")
    check_float("bias", bias)
    return bias.view(1, n) if bias.dim() == 1 else bias


def toeplitz_mix(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str = "reference",
    method: str = "auto",
    recipe: str = "",
) -> torch.Tensor:
    """Causal Toeplitz mixing along time, y_t = Σ_{s ≤ t} w[t − s] x_s + b[t], by FFT.

    Args:
        x (torch.Tensor): `[B, T, C]`.
        w (torch.Tensor): `[n]`, `[heads, n]` or `[kernel, heads, n]` with n ≥ T (n = max_len).
        bias (torch.Tensor, Optional): position bias `[n]` or `[heads, n]`. Default: `None`.
        backend (str, Optional): "reference" (torch.fft), "triton" or "auto". Default: "reference".
        method (str, Optional): for backend "triton": "fft" (cuFFT in fp32 with fused Triton
            passes; every dtype and variant), "blocked" (blocked DFTs on tensor cores with bf16
            spectra, `blocked.py`: 16-bit x, kernel size 1, one head or heads of a multiple of 32
            channels; about the dense bf16 product's accuracy) or "auto" (blocked where it applies,
            else fft). Default: "auto".
        recipe (str, Optional): the blocked path's recipe, a name of `recipe.RECIPES` ("tiles",
            "gather"); "" picks the default for the call's shape. Default: "".

    Returns:
        y (torch.Tensor): `[B, T, C]` in the dtype of `x`.
    """
    check_shape("x", x, [None, None, None], "[B, T, C]")
    check_float("x", x)
    B, T, C = x.shape
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}, got {method!r}")
    if pick_backend(backend, x) == "triton":
        return _triton_mix(x, w, bias, method, recipe)
    w3, b2 = normalize_weights(w, bias, C, T)
    return fft_toeplitz_mix(x, w3, b2).to(x.dtype)


_IMPL: list = []


def _impl():
    """The Triton-side modules, imported on first use (they import Triton) and kept: an import
    statement in the call costs host time on every call. (A plain list, not functools.cache:
    torch.compile warns on an lru_cache wrapper in a traced call.)"""
    if not _IMPL:
        from ..common.custom_op import eager_autograd_ok
        from . import blocked, ops

        _IMPL.append((blocked.eligible, ops, eager_autograd_ok))
    return _IMPL[0]


def _triton_mix(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, method: str, recipe: str):
    eligible, ops, eager_autograd_ok = _impl()
    check_triton_dtype(x)
    B, T, C = x.shape
    w3, b2 = normalize_weights(w, bias, C, T)
    kernel, heads = w3.shape[0], w3.shape[1]
    b2c = None if b2 is None else b2.contiguous()
    use_blocked = eligible(x, kernel, heads)
    if method == "blocked" and not use_blocked:
        raise ValueError(
            "method='blocked' needs x in bf16/fp16, w of kernel size 1 ([n] or [heads, n]) and "
            f"one head or heads of a multiple of 32 channels; got {x.dtype}, w {list(w.shape)}, C={C}"
        )
    if not use_blocked or method == "fft":
        if recipe:
            raise ValueError(f"recipe {recipe!r} is the blocked path's; this call takes the FFT path")
        return ops.toeplitz_fft(x, w3.contiguous(), b2c)
    # w as given where it already is [heads, n] or [n] (indexing w3 costs host time)
    if w.dim() == 2 and w.shape[0] == heads:
        w1 = w.contiguous()
    elif w.dim() == 1 and heads == 1:
        w1 = w.contiguous().view(1, -1)
    else:
        w1 = w3[0].contiguous()
    S = block_size(T)
    if recipe:  # an unknown name fails here, not in the backward
        pick(recipe, heads, T, S)
    if torch.is_grad_enabled() and eager_autograd_ok(x, w1, b2c):
        return ops.BlockedFunction.apply(x, w1, b2c, S, recipe)
    return ops.toeplitz_blocked(x, w1, b2c, S, recipe)


def toeplitz_mix_step(
    x_cache: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str = "reference",
) -> torch.Tensor:
    """Decode: the output at the newest cached position t from the cached inputs x_1..x_t (O(t)).

    Args:
        x_cache (torch.Tensor): `[B, t, C]` mixer inputs so far, the newest last.
        w (torch.Tensor): `[n]`, `[heads, n]` or `[kernel, heads, n]` with n ≥ t.
        bias (torch.Tensor, Optional): `[n]` or `[heads, n]`. Default: `None`.
        backend (str, Optional): "reference", "triton" or "auto". Default: "reference".

    Returns:
        y_t (torch.Tensor): `[B, C]` in the dtype of `x_cache`.
    """
    check_shape("x_cache", x_cache, [None, None, None], "[B, t, C]")
    check_float("x_cache", x_cache)
    B, t, C = x_cache.shape
    if t < 1:
        raise ValueError("`x_cache` must hold at least the newest input: [B, t, C] with t ≥ 1")
    w3, b2 = normalize_weights(w, bias, C, t)
    if pick_backend(backend, x_cache) == "triton":
        from .ops import toeplitz_step

        check_triton_dtype(x_cache)
        return toeplitz_step(x_cache, w3.contiguous(), None if b2 is None else b2.contiguous())
    return toeplitz_step_ref(x_cache, w3, b2).to(x_cache.dtype)
