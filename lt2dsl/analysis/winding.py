"""Winding numbers of Toeplitz symbols, and the Fredholm index of a trained `tmm` layer.

A `tmm` head mixes time with the lower-triangular Toeplitz matrix M[t, s] = w[t − s] (s ≤ t;
`lt2dsl/kernels/toeplitz/naive.py`), whose symbol is the polynomial a(z) = Σ_m w[m] z^m. For a
symbol that does not vanish on the unit circle the Toeplitz operator T(a) is Fredholm with
index −wind(a, 0) (Gohberg), and for this analytic symbol wind(a, 0) is the number of zeros of
a inside the unit disc: 0 means T(a) is invertible with a causal, stable inverse; m > 0 means
its range misses m dimensions (a(z) = z, a one-step delay, has index −1).

The kernel variant (k taps) mixes channels c − k + 1 … c into channel c, so its block symbol is
lower triangular over channels with tap k − 1 on the diagonal: det A(z) = Π_c a_{k−1, head(c)}(z),
and the layer's index is −(C / heads) Σ_η wind(a_{k−1, η}). The projections of a multi-head
layer are constant matrices and change no index.

The symbol is sampled at N ≥ 64n roots of unity (an FFT), then refined where needed. With
L2 = Σ_m m² |w_m| (a bound of |a''(θ)|), a point within δ of a sample θ_j lies within
|a'(θ_j)| δ + L2 δ² / 2 of a(θ_j); when that is below |a(θ_j)| from both ends of every interval
between samples, no arc comes near 0, each sampled argument step is the true one (each half is
under π/2), and the count is `certified`. Intervals that fail the test get 7 more samples each,
until every one passes or `max_points` samples (default 4N) are spent; an uncertified count is
still given when no argument step exceeds π/4. `margin` = min |a| / max |a| over the samples
says how close a(z) comes to vanishing on the circle (below 1e-9: no index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_POINTS = 4096
MIN_MARGIN = 1e-9  # below this the symbol vanishes on the circle (to rounding): no index


@dataclass(frozen=True)
class Winding:
    """wind(a, 0) of one symbol; `number` is None when a vanishes on the circle (to rounding) or
    the sampling stayed too coarse to count; `certified`: exact by the Lipschitz bound."""

    number: int | None
    certified: bool
    margin: float
    points: int


def symbol_on_circle(w: np.ndarray, points: int) -> np.ndarray:
    """a(e^{2πij/N}) = Σ_m w[m] e^{2πijm/N} for j < N: `[..., n]` → `[..., N]` complex (N ≥ n)."""
    if points < w.shape[-1]:
        raise ValueError(f"points ({points}) must be at least the symbol's length ({w.shape[-1]})")
    return np.fft.ifft(w, n=points, axis=-1) * points


def _at(w: np.ndarray, theta: np.ndarray, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """a(e^{iθ}) and d/dθ a(e^{iθ}) at arbitrary angles `[k]` (direct sums, in chunks)."""
    m = np.arange(w.size)
    a, da = np.empty(theta.size, np.complex128), np.empty(theta.size, np.complex128)
    for i in range(0, theta.size, chunk):
        E = np.exp(1j * np.outer(theta[i : i + chunk], m))
        a[i : i + chunk], da[i : i + chunk] = E @ w, E @ (1j * m * w)
    return a, da


def _unsafe(theta, a, da, L2) -> np.ndarray:
    """Per interval [θ_j, θ_{j+1}] (closing the circle): True where the bound cannot exclude 0."""
    gap = np.diff(np.append(theta, theta[0] + 2 * np.pi))
    half = gap / 2
    reach_l = np.abs(da) * half + L2 * half**2 / 2
    reach_r = np.roll(np.abs(da), -1) * half + L2 * half**2 / 2
    return (reach_l >= np.abs(a)) | (reach_r >= np.roll(np.abs(a), -1))


def winding_number(w: np.ndarray, max_points: int | None = None) -> Winding:
    """wind(a, 0) of a(z) = Σ_m w[m] z^m around the unit circle (module docstring).

    Args:
        w: `[n]` real or complex coefficients, w[m] of z^m.
        max_points: the most samples spent before giving up certification (default 4N).
    """
    w = np.asarray(w, dtype=np.complex128)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"a symbol is a non-empty 1-D coefficient array, got shape {w.shape}")
    m = np.arange(w.size)
    L2 = float(np.sum(m**2 * np.abs(w)))
    N = max(MIN_POINTS, 1 << (64 * w.size - 1).bit_length())
    max_points = max_points or 4 * N
    theta = 2 * np.pi * np.arange(N) / N
    a, da = symbol_on_circle(w, N), symbol_on_circle(1j * m * w, N)
    while True:
        mag = np.abs(a)
        margin = float(mag.min() / mag.max()) if mag.max() > 0 else 0.0
        if margin < MIN_MARGIN:
            return Winding(None, False, margin, theta.size)
        steps = np.angle(np.roll(a, -1) / a)  # arg a(θ_{j+1}) − arg a(θ_j), closing the loop
        turns = int(np.rint(steps.sum() / (2 * np.pi)))
        bad = np.flatnonzero(_unsafe(theta, a, da, L2))
        if bad.size == 0:
            return Winding(turns, True, margin, theta.size)
        if theta.size + 7 * bad.size > max_points:
            fine = np.abs(steps).max() <= np.pi / 4
            return Winding(turns if fine else None, False, margin, theta.size)
        gap = np.diff(np.append(theta, theta[0] + 2 * np.pi))[bad]
        new = (theta[bad][:, None] + gap[:, None] * np.arange(1, 8) / 8).ravel()
        a_new, da_new = _at(w, new)
        order = np.argsort(np.concatenate([theta, new]), kind="stable")
        theta = np.concatenate([theta, new])[order]
        a, da = np.concatenate([a, a_new])[order], np.concatenate([da, da_new])[order]


@dataclass(frozen=True)
class SymbolRow:
    """One (block, head, tap) symbol of a `tmm` layer."""

    block: int
    head: int
    tap: int
    diagonal: bool
    winding: int | None
    certified: bool
    margin: float


def layer_windings(w: np.ndarray, block: int, length: int | None = None) -> list[SymbolRow]:
    """Every symbol of one layer's `w [kernel, heads, n]` (truncated to `length` coefficients)."""
    kernel, heads, n = w.shape
    w = w[..., : length or n]
    rows = []
    for j in range(kernel):
        for h in range(heads):
            wn = winding_number(w[j, h])
            rows.append(SymbolRow(block, h, j, j == kernel - 1, wn.number, wn.certified, wn.margin))
    return rows


def layer_index(rows: list[SymbolRow], channels: int, heads: int) -> int | None:
    """−(C / heads) Σ over the diagonal taps' windings; None when one of them has no winding."""
    diag = [r.winding for r in rows if r.diagonal]
    if any(x is None for x in diag):
        return None
    return -(channels // heads) * sum(diag)
