"""Inputs of `gdn_block_decode` at a given shape, shared by its tests and `bench/decode_stream.py`."""

from __future__ import annotations

import torch

W = 4  # the short convs' width (the hybrid's)


def inputs(bias: bool, seed: int, shape: tuple[int, ...], device: str | torch.device = "cpu"):
    """(args, kwargs) of one `gdn_block_decode` call in float64 at shape (M, D, H, HV, K, V, F);
    the in-projection's offsets put z first and leave 3 padding columns after each part."""
    M, D, H, HV, K, V, FF = shape
    g = torch.Generator().manual_seed(seed)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(device)

    sizes = {"z": HV * V, "q": H * K, "b": HV, "k": H * K, "v": HV * V, "a": HV}
    offs, at = {}, 0
    for name, n in sizes.items():
        offs[name] = at
        at += n + 3  # padding columns nobody reads
    n_in = at
    cs = (H * K, H * K, HV * V)
    args = dict(
        xn=r(M, D), res=r(M, D), w_in=r(n_in, D, scale=D**-0.5), offsets=tuple(offs[n] for n in "qkvzab"),
        conv_weights=tuple(r(c, 1, W, scale=0.5) for c in cs),
        conv_biases=tuple(r(c, scale=0.1) if bias else None for c in cs),
        hists=tuple(r(M, c, W - 1) for c in cs), A_log=r(HV, scale=0.5), dt_bias=r(HV, scale=0.5),
        state=r(M, HV, K, V, scale=0.3), gamma_o=1 + 0.2 * r(V), w_o=r(D, HV * V, scale=(HV * V) ** -0.5),
        gamma2=1 + 0.2 * r(D), w_gu=r(2 * FF, D, scale=D**-0.5), w_down=r(D, FF, scale=FF**-0.5),
    )  # fmt: skip
    kw = dict(heads=H, scale=K**-0.5, beta_scale=2.0, eps_o=1e-5, eps2=1e-6)
    return args, kw


def as_dtype(args: dict, dtype) -> dict:
    """Everything in `dtype` but the fp32 gates' parameters and state (the lowering's dtypes)."""
    out = {}
    for k, v in args.items():
        if k in ("A_log", "dt_bias", "state"):
            out[k] = v.to(torch.float64 if dtype == torch.float64 else torch.float32).clone()
        elif isinstance(v, tuple) and v and isinstance(v[0], int):
            out[k] = v
        elif isinstance(v, tuple):
            out[k] = tuple(None if t is None else t.to(dtype).clone() for t in v)
        else:
            out[k] = v.to(dtype)
    return out
