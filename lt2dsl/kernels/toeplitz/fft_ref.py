"""Causal Toeplitz product by FFT in PyTorch (the `backend="reference"` path; mixers.md §13(b)).

Y = irfft(rfft(x, N) ⊙ rfft(w[:T], N), N)[:T] + b with N the next power of two ≥ 2T, so the circular
convolution never wraps around: lags t − s lie in (−T, T) and the negative ones land on indices
≥ N − T + 1 > T − 1, where the zero-padded w is 0. Transforms are fp32 (float64 for float64 inputs);
the kernel variant mixes shifted channels in the frequency domain (the shift is linear).
"""

from __future__ import annotations

import torch

from .naive import shift_channels


def fft_size(T: int) -> int:
    """Smallest power of two ≥ 2T (≥ 2): no wrap-around for a length-T causal convolution."""
    return max(2, 1 << (2 * T - 1).bit_length())


def fft_toeplitz_mix(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """FFT form of the causal Toeplitz mixer, differentiable by autograd: x `[B, T, C]`, w and bias
    as `naive_toeplitz_mix`; y `[B, T, C]` in the transform dtype (fp32, or float64 for float64 inputs).
    """
    B, T, C = x.shape
    kernel, heads, _ = w.shape
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    N = fft_size(T)
    Xf = torch.fft.rfft(x.to(dt), n=N, dim=1)  # [B, F, C]
    Wf = torch.fft.rfft(w[..., :T].to(dt), n=N, dim=-1)  # [kernel, heads, F]
    F_ = Xf.shape[1]
    Yf = Xf.new_zeros(B, F_, heads, C // heads)
    for j in range(kernel):
        Xs = shift_channels(Xf, kernel - 1 - j).view(B, F_, heads, C // heads)
        Yf = Yf + Xs * Wf[j].transpose(0, 1)[None, :, :, None]
    y = torch.fft.irfft(Yf.view(B, F_, C), n=N, dim=1)[:, :T]
    if bias is not None:
        y = (y.view(B, T, heads, C // heads) + bias.to(dt)[:, :T].transpose(0, 1)[None, :, :, None]).view(
            B, T, C
        )
    return y
