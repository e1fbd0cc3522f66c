"""Dense masked Toeplitz product and the per-token step: the numerical truth for `toeplitz_mix`.

mixers.md §13(b): per channel y_t = Σ_{s ≤ t} w[t − s] x_s + b[t]; kernel variant (§13(a)):
output channel c mixes input channels c − k + 1 … c (zero-padded below channel 0),
y[c, t] = Σ_j Σ_{s ≤ t} w^{(j)}[t − s] x[c − k + 1 + j, s] + b[t]. Weights are normalised to
`[kernel, heads, n]` and biases to `[heads, n]` by `normalize_weights`.
"""

from __future__ import annotations

import torch


def shift_channels(x: torch.Tensor, shift: int) -> torch.Tensor:
    """x[..., c − shift] along the last dim, zeros where c − shift < 0 (`[..., C]` → `[..., C]`).

    A shift of C or more leaves no channel in range: all zeros. A negative shift is a `ValueError`.
    """
    if shift < 0:
        raise ValueError(f"shift_channels: expected a shift >= 0, got {shift}")
    if shift == 0:
        return x
    C = x.shape[-1]
    if shift >= C:
        return torch.zeros_like(x)
    pad = x.new_zeros(*x.shape[:-1], shift)
    return torch.cat([pad, x[..., : C - shift]], dim=-1)


def naive_toeplitz_mix(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dense lower-triangular Toeplitz matrices times x (O(T²) per channel).

    Args:
        x (torch.Tensor): `[B, T, C]`.
        w (torch.Tensor): `[kernel, heads, n]` with n ≥ T; C divisible by heads.
        bias (torch.Tensor, Optional): `[heads, n]`. Default: `None`.

    Returns:
        y (torch.Tensor): `[B, T, C]` in the compute dtype (fp32, or float64 for float64 inputs).
    """
    B, T, C = x.shape
    kernel, heads, _ = w.shape
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    x, w = x.to(dt), w.to(dt)
    lag = torch.arange(T, device=x.device)[:, None] - torch.arange(T, device=x.device)[None, :]
    # [kernel, heads, T, T]: M[t, s] = w[t − s] for s ≤ t
    M = torch.where(lag >= 0, w[..., lag.clamp(min=0)], torch.zeros((), dtype=dt, device=x.device))
    y = x.new_zeros(B, T, heads, C // heads)
    for j in range(kernel):
        xs = shift_channels(x, kernel - 1 - j).view(B, T, heads, C // heads)
        y = y + torch.einsum("hts,bshc->bthc", M[j], xs)
    if bias is not None:
        y = y + bias.to(dt)[:, :T].transpose(0, 1)[None, :, :, None]
    return y.reshape(B, T, C)


def toeplitz_step_ref(
    x_cache: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Output at the last cached position t: y_t = Σ_{s ≤ t} w[t − s] x_s + b[t] (O(t) per channel).

    Args:
        x_cache (torch.Tensor): `[B, t, C]` the mixer inputs x_1..x_t.
        w (torch.Tensor): `[kernel, heads, n]`, n ≥ t.
        bias (torch.Tensor, Optional): `[heads, n]`. Default: `None`.

    Returns:
        y (torch.Tensor): `[B, C]` in the compute dtype.
    """
    B, t, C = x_cache.shape
    kernel, heads, _ = w.shape
    dt = torch.float64 if x_cache.dtype == torch.float64 else torch.float32
    # w[t − 1 − s] for s = 0..t−1: the newest input meets w[0]
    w_rev = w[..., :t].flip(-1).to(dt)
    y = x_cache.new_zeros(B, heads, C // heads, dtype=dt)
    for j in range(kernel):
        xs = shift_channels(x_cache, kernel - 1 - j).to(dt).view(B, t, heads, C // heads)
        y = y + torch.einsum("bshc,hs->bhc", xs, w_rev[j])
    if bias is not None:
        y = y + bias[:, t - 1].to(dt)[None, :, None]
    return y.reshape(B, C)
