"""The reference of `gdn_block_decode`: the unfused chain a GDN block's decode step runs, in order."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lt2dsl.kernels.delta.gdn_step import gdn_step_ref


def gdn_block_decode_ref(
    xn: Tensor, res: Tensor, w_in: Tensor, offsets: tuple[int, ...], conv_weights, conv_biases, hists,
    A_log: Tensor, dt_bias: Tensor, state: Tensor, gamma_o: Tensor, w_o: Tensor, gamma2: Tensor,
    w_gu: Tensor, w_down: Tensor, *, heads: int, scale: float, beta_scale: float, eps_o: float, eps2: float,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`F.linear` (the in-projection), `gdn_step_ref` (convs, recurrence, gated norm; histories and
    state in place), `F.linear` + residual, RMSNorm · γ₂, `F.linear`, SwiGLU, `F.linear`, each
    rounded to the dtype as the unfused nodes are (float64 inputs: the truth). Returns (h2, y)."""
    B, HV, K, V = state.shape
    H = heads
    y1 = F.linear(xn, w_in)
    q0, k0, v0, z0, a0, b0 = offsets
    cols = ((q0, H * K), (k0, H * K), (v0, HV * V), (a0, HV), (b0, HV), (z0, HV * V))
    xq, xk, xv, xa, xb, xz = (y1[:, None, o : o + n] for o, n in cols)
    on = gdn_step_ref(
        xq, xk, xv, xa, xb, xz, conv_weights, conv_biases, hists, A_log, dt_bias, state, gamma_o,
        heads=H, scale=scale, beta_scale=beta_scale, eps=eps_o,
    )  # fmt: skip
    h2 = res + F.linear(on.flatten(1), w_o)
    wide = torch.float64 if h2.dtype == torch.float64 else torch.float32
    n2 = (F.rms_norm(h2.to(wide), (h2.shape[-1],), eps=eps2) * gamma2.to(wide)).to(h2.dtype)
    gu = F.linear(n2, w_gu)
    hid = w_down.shape[1]
    g, u = gu[:, :hid].to(wide), gu[:, hid:].to(wide)
    act = (F.silu(g) * u).to(h2.dtype)
    return h2, F.linear(act, w_down)
