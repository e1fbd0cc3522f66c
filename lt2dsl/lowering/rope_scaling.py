"""RoPE frequency scaling: the inverse frequencies of `linear` and `llama3` scaling.

`scaling` is a hashable tuple (it keys the RoPE tables and is a constant argument of the traced
`apply_rope` leaf): `("linear", factor)` or `("llama3", factor, low, high, original_len)`.

* linear (position interpolation): inv_freq / factor, i.e. positions divided by the factor.
* llama3 (Meta's Llama 3.1 rule): with wavelengths λ_i = 2π / inv_freq_i, λ_lo = original / low and
  λ_hi = original / high: λ_i > λ_lo → inv_freq_i / factor; λ_i < λ_hi → unchanged; in between the
  interpolation (1 − s) inv_freq_i / factor + s inv_freq_i with s = (original / λ_i − low) / (high − low).
Neither changes the attention scale (HF's `attention_factor` is 1 for both).
"""

from __future__ import annotations

import math

import torch

Scaling = tuple | None


def rope_scaling_of(opts: dict) -> Scaling:
    """The scaling tuple of a mixer's resolved options (None without scaling)."""
    kind = opts.get("rope_scaling", "none")
    if kind == "linear":
        return ("linear", float(opts["rope_factor"]))
    if kind == "llama3":
        return (
            "llama3",
            float(opts["rope_factor"]),
            float(opts["rope_low_freq"]),
            float(opts["rope_high_freq"]),
            int(opts["rope_original_len"]),
        )
    return None


def scale_inv_freq(inv: torch.Tensor, scaling: Scaling) -> torch.Tensor:
    """Inverse frequencies `[dim/2]` after `scaling` (unchanged for None)."""
    if scaling is None:
        return inv
    if scaling[0] == "linear":
        return inv / scaling[1]
    _, factor, low, high, original = scaling
    wavelen = 2 * math.pi / inv
    lo_wavelen, hi_wavelen = original / low, original / high
    scaled = torch.where(wavelen > lo_wavelen, inv / factor, inv)
    s = (original / wavelen - low) / (high - low)
    smoothed = (1 - s) * scaled / factor + s * scaled
    medium = (wavelen >= hi_wavelen) & (wavelen <= lo_wavelen)
    return torch.where(medium, smoothed, scaled)
