"""The blocked DFT form of the causal Toeplitz product, in PyTorch: the three passes of `blocked.py`.

Time is cut into M blocks of S samples (t = J·S + i). Block J's output is the first S samples of the
2S-point circular convolution of the zero-padded input block with the kernel window around lag J·S,
so with X_J = DFT_2S([x_J, 0]) and V_D = DFT_2S(u_D), u_D[j] = w[D·S + j] for 0 ≤ j < S and
w[D·S + j − 2S] for S < j < 2S (u_D[S] is never read):

    y_I = first S samples of IDFT_2S( Σ_{J ≤ I} V_{I−J} ⊙ X_J ).

Per frequency bin the sum over J is a causal Toeplitz product along the block axis, the same for
every channel, so each of the three passes is a matrix product (tensor cores in the Triton kernels):
1. `spectra`: X = F · x_J per block, F the real `[2S, S]` DFT matrix (rows: Re/Im of bins 0 … S−1,
   with the real Nyquist bin S in the imaginary row of the real bin 0: 2S reals per block, exactly);
2. `mix_blocks`: per bin, Z = T(V) · X along the block axis (a complex lower-triangular Toeplitz
   `[M, M]`; bin 0's pair of real bins are two real Toeplitz products);
3. `samples`: y_I = G · Z_I with G = Fᵀ diag(c) / 2S the first S rows of the inverse real DFT.
The adjoint runs the same passes with Gᵀ, T(V)ᵀ and Fᵀ (`transpose=True`), which is the backward's
dx; the kernel's gradient comes from the per-bin correlations of the two spectra.
Cost per channel and token: 8S (passes 1 and 3) + 4M (pass 2) multiply-adds, so S ≈ √(T/2).
"""

from __future__ import annotations

import math

import torch


def block_size(T: int) -> int:
    """The block S for length T: √(T/2) balances the per-block DFTs against the block-axis products."""
    return 64 if T <= 8192 else 128


def packed_dft(S: int, n: int, device=None) -> torch.Tensor:
    """`[2S, n]` float64: rows Re/Im of bins 0 … S−1 of a 2S-point DFT over its first n samples,
    the real Nyquist bin S in the imaginary row of the real bin 0 (2S reals per transform)."""
    i = torch.arange(n, dtype=torch.float64, device=device)
    k = torch.arange(S, dtype=torch.float64, device=device)
    ang = math.pi * k[:, None] * i[None, :] / S  # 2π k i / 2S
    F = torch.empty(2 * S, n, dtype=torch.float64, device=device)
    F[0::2] = torch.cos(ang)
    F[1::2] = -torch.sin(ang)
    F[1] = torch.cos(math.pi * i)  # the Nyquist bin S, real
    return F


def dft_matrices(S: int, dtype=torch.float64, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(F `[2S, S]`, G `[S, 2S]`): the packed real DFT of a zero-padded block and its inverse."""
    F = packed_dft(S, S, device)
    c = torch.full((2 * S,), 2.0, dtype=torch.float64, device=device)
    c[:2] = 1.0
    G = F.t() * c[None, :] / (2 * S)
    return F.to(dtype), G.to(dtype)


def window_lags(T: int, S: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(lag `[M, 2S]` int64 clamped to [0, T), valid `[M, 2S]` bool): u_D[j] = w[lag] where valid."""
    M = -(-T // S)
    j = torch.arange(2 * S, device=device)
    rel = torch.where(j < S, j, j - 2 * S)
    lag = torch.arange(M, device=device)[:, None] * S + rel[None, :]
    valid = (lag >= 0) & (lag < T) & (j != S)[None, :]
    return lag.clamp(0, max(T - 1, 0)), valid


def window_spectra(w: torch.Tensor, T: int, S: int) -> torch.Tensor:
    """Packed kernel spectra `[heads, S, 2, M]` (fp32, or float64 for float64 w) of w `[heads, n]`.

    [h, k, 0/1, D] = Re/Im V_D[k] for bins 1 … S−1; [h, 0, 0/1, D] = V_D[0], V_D[S] (both real).
    Differentiable: the backward's dw is autograd through this (small) function.
    """
    dt = torch.float64 if w.dtype == torch.float64 else torch.float32
    lag, valid = window_lags(T, S, w.device)
    u = torch.where(valid, w.to(dt)[:, lag], 0.0)  # [heads, M, 2S]
    V = torch.fft.rfft(u, dim=-1)  # [heads, M, S + 1]
    re, im = V.real, V.imag
    im = torch.cat([re[..., S:], im[..., 1:S]], dim=-1)  # bin 0's imaginary slot holds bin S
    return torch.stack([re[..., :S], im], dim=-1).permute(0, 2, 3, 1)  # [heads, S, 2, M]


def spectra(x: torch.Tensor, F: torch.Tensor, S: int) -> torch.Tensor:
    """Pass 1: `[B, 2S, M, C]` from x `[B, T, C]` (blocks zero-padded past T)."""
    B, T, C = x.shape
    M = -(-T // S)
    xb = torch.nn.functional.pad(x, (0, 0, 0, M * S - T)).view(B, M, S, C)
    return torch.einsum("ri,bjic->brjc", F, xb)


def mix_blocks(X: torch.Tensor, V: torch.Tensor, heads: int, transpose: bool = False) -> torch.Tensor:
    """Pass 2: per bin the (complex) causal Toeplitz product along blocks; `[B, 2S, M, C]` in and out."""
    B, R, M, C = X.shape
    S = R // 2
    D = torch.arange(M, device=X.device)
    lag = D[:, None] - D[None, :]  # [I, J]
    if transpose:
        lag = -lag
    Tm = torch.where(lag >= 0, V[..., lag.clamp(min=0)], 0.0)  # [heads, S, 2, M, M]
    Xh = X.view(B, S, 2, M, heads, C // heads)
    xr, xi = Xh[:, :, 0], Xh[:, :, 1]  # [B, S, M, heads, CH]
    tr, ti = Tm[:, :, 0], Tm[:, :, 1]  # [heads, S, M, M]

    def prod(t, x):
        return torch.einsum("hkij,bkjhc->bkihc", t, x)

    sgn = 1.0 if transpose else -1.0
    zr = prod(tr, xr) + sgn * prod(ti, xi)
    zi = prod(tr, xi) - sgn * prod(ti, xr)
    # bin 0: two real bins (0 in the real slot, S in the imaginary one)
    zr[:, 0] = prod(tr[:, :1], xr[:, :1])[:, 0]
    zi[:, 0] = prod(ti[:, :1], xi[:, :1])[:, 0]
    return torch.stack([zr, zi], dim=2).view(B, R, M, C)


def samples(Z: torch.Tensor, G: torch.Tensor, T: int) -> torch.Tensor:
    """Pass 3: y `[B, T, C]` from `[B, 2S, M, C]`."""
    B, R, M, C = Z.shape
    y = torch.einsum("ir,brjc->bjic", G, Z).reshape(B, M * (R // 2), C)
    return y[:, :T]


def blocked_toeplitz_mix(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, S: int | None = None
) -> torch.Tensor:
    """The blocked form end to end for w `[heads, n]` (kernel size 1), bias `[heads, n]` or None."""
    B, T, C = x.shape
    heads = w.shape[0]
    S = S or block_size(T)
    F, G = dft_matrices(S, x.dtype, x.device)
    V = window_spectra(w, T, S).to(x.dtype)
    y = samples(mix_blocks(spectra(x, F, S), V, heads), G, T)
    if bias is not None:
        y = (y.view(B, T, heads, C // heads) + bias[:, :T].t()[None, :, :, None].to(y.dtype)).view(B, T, C)
    return y
