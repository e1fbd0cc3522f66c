"""`mamba2`: Mamba2 / SSD (mixers.md §7), parameterized as mamba_ssm's `Mamba2`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lt2dsl.ir.specs.mamba2 import dims
from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.lowering.functional import short_conv
from lt2dsl.lowering.functional_recurrent import (
    GatedRMSNorm,
    init_A_log,
    init_dt_bias,
    init_linears,
    math_dtype,
    simple_gla_core,
)
from lt2dsl.lowering.layers.base import MixerLayer, linear
from lt2dsl.lowering.leaf import leaf


@leaf
def mamba2_gates(a, x, A_log, dt_bias, *, dtype: torch.dtype, backend: str = "reference"):
    """(v, g) of Mamba2: dt = softplus(a + dt_bias) in `dtype`, the core's value v = dt · x back in
    x's dtype (not the parameters': under autocast q, k, v must share one dtype) and its log decay
    g = dt · (−exp(A_log)) (`kernels.fused.naive.mamba2_gate_ref`). a `[B, T, H]`, x `[B, T, H, P]`.

    A decode call (one token per row) runs `kernels.fused.mamba2_gate` with `backend`: one launch
    on its Triton path, equal to the unfused ops up to fp32 rounding. Prefill and training run the
    unfused ops themselves, so their results do not depend on the backend.
    """
    if x.shape[1] == 1:
        return fused.mamba2_gate(a, x, A_log, dt_bias, dtype=dtype, backend=backend)
    return naive.mamba2_gate_ref(a, x, A_log, dt_bias, dtype)


@leaf
def mamba2_skip(y, D, x):
    """The core output plus the skip term, y + D_h · x `[B, T, H, P]` (D `[H]`). A decode call (one
    token per row) is one `addcmul` launch, D · x unrounded before the sum (a difference of one
    rounding in y's dtype); prefill and training run the unfused product and sum, bit for bit."""
    if x.shape[1] == 1:
        return torch.addcmul(y, D[:, None], x)
    return y + D[:, None] * x


class Mamba2(MixerLayer):
    """Selective state space with a scalar decay per head (SSD), run as scalar-decay linear attention.

    x `[B, T, D]` → in_proj → [z (d_in), x (d_in), B (G·N), C (G·N), dt (H)]; causal depthwise
    conv (with bias) + SiLU on xBC (SiLU alone when `conv=0`); dt = softplus(dt + dt_bias),
    A = −exp(A_log) in fp32; per head h (group h // (H/G)):
    h_t = exp(dt_t A) h_{t−1} + dt_t x_t B_tᵀ, y_t = h_t C_t + D·x_t — the core gets
    (q, k, v, g) = (C, B, dt·x, dt·A) with scale 1 (mixers.md §15.3), state `[B, H, N, P]`.
    Then RMSNorm over groups of d_in/G channels of y ⊙ SiLU(z) (gate before the norm, eps 1e-5)
    and out_proj. Init: A = U(1, 16), D = 1, dt_bias = softplus⁻¹(dt) with dt log-uniform in
    [1e-3, 0.1]; in_proj/out_proj normal(0, 0.02); conv PyTorch's Conv1d default (mamba_ssm).
    """

    kind = "mamba2"

    def __init__(self, opts, cfg, backend: str = "reference"):
        super().__init__(opts, cfg, backend)
        d_in, H, P, N, G = dims(self.opts, cfg.dim)
        self.d_in, self.H, self.P, self.N, self.G, self.W = d_in, H, P, N, G, self.opts["conv"]
        xbc = d_in + 2 * G * N
        self.in_proj = linear(cfg.dim, 2 * d_in + 2 * G * N + H)
        if self.W > 0:
            self.conv1d = nn.Conv1d(xbc, xbc, self.W, groups=xbc, bias=True)
        self.dt_bias = nn.Parameter(torch.empty(H))
        self.A_log = nn.Parameter(torch.empty(H))
        self.D = nn.Parameter(torch.ones(H))
        self.norm = GatedRMSNorm(d_in, eps=1e-5, act="silu", group=d_in // G, norm_before_gate=False)
        self.out_proj = linear(d_in, cfg.dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears(self)
        init_A_log(self.A_log, 1.0, 16.0)
        init_dt_bias(self.dt_bias)
        nn.init.ones_(self.D)

    def _xbc(self, xbc: torch.Tensor, entry, cu_seqlens=None) -> torch.Tensor:
        """Conv + SiLU of xBC `[B, T, d_in + 2GN]`, its last W−1 inputs cached as `xbc_conv`."""
        if self.W == 0:
            return F.silu(xbc)
        return short_conv(xbc, self.conv1d.weight, self.conv1d.bias, entry, "xbc_conv", cu_seqlens=cu_seqlens)

    def forward(self, x: torch.Tensor, entry=None, pos: int = 0, cu_seqlens=None) -> torch.Tensor:
        """x `[B, T, D]` → `[B, T, D]`; `entry` holds `state` `[B, H, N, P]` and `xbc_conv`."""
        self.check(x)
        d_in, GN = self.d_in, self.G * self.N
        z, xbc, dt = self.in_proj(x).split([d_in, d_in + 2 * GN, self.H], dim=-1)
        xs, Bm, Cm = self._xbc(xbc, entry, cu_seqlens).split([d_in, GN, GN], dim=-1)
        xh = xs.unflatten(-1, (self.H, self.P))  # [B, T, H, P]
        gates = mamba2_gates(dt, xh, self.A_log, self.dt_bias, dtype=math_dtype(self), backend=self.backend)
        v, g = gates[0], gates[1]  # by index: a traced tuple unpacked keeps a decode cache alive
        q, k = Cm.unflatten(-1, (self.G, self.N)), Bm.unflatten(-1, (self.G, self.N))
        y = simple_gla_core(q, k, v, g, entry, scale=1.0, **self.core_kwargs(cu_seqlens))
        y = mamba2_skip(y, self.D, xh)
        return self.out_proj(self.norm(y.flatten(-2), z))
