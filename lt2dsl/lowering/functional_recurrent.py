"""Pieces shared by the recurrent mixer layers (gdn, kda, deltanet, gla, retnet, mamba2, mlstm, linear).

* One `@leaf` per core op (`gated_delta_rule_core`, ..., `mlstm_core`): it reads the
  layer's recurrent state from the cache entry, calls the op of `lt2dsl.kernels` and writes the
  final state back, so the traced graph shows exactly one node per core with the entry as an
  argument, and the forward never branches on whether a cache is present.
* `xpos_rotate`, `xpos_rotate_qk`: RetNet's interleaved-pair rotation at absolute positions (leaves:
  they read `pos`).
* `GatedRMSNorm`: fla's per-head (or per-group) RMSNorm with an optional SiLU / sigmoid gate.
* Initialisers of the gate parameters (mixers.md §5(a), §7(a)).
"""

from __future__ import annotations

import math

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from lt2dsl.kernels.delta import delta_rule, gated_delta_rule, kda
from lt2dsl.kernels.gla import gla
from lt2dsl.kernels.mlstm import mlstm
from lt2dsl.kernels.simple_gla import simple_gla
from lt2dsl.lowering import packed
from lt2dsl.lowering.cache import RowPositions
from lt2dsl.lowering.functional import short_conv
from lt2dsl.lowering.leaf import leaf

STATE_DTYPES = (torch.float32, torch.float64)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """Gates, norms and rotations run in fp32, or float64 when the layer runs in float64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def param_dtype(module: nn.Module) -> torch.dtype:
    """dtype of the module's parameters, read without tracing (attribute access would give a Proxy)."""
    return next(module.parameters()).dtype


def math_dtype(module: nn.Module) -> torch.dtype:
    """fp32, or float64 for a float64 module: the dtype gates and norms are computed in."""
    return torch.float64 if param_dtype(module) == torch.float64 else torch.float32


def check_input(x, dim: int, dtype: torch.dtype, kind: str) -> None:
    """Raise ValueError unless `x` is a floating `[B, T, dim]` tensor of the layer's dtype.

    Skipped while tracing (`x` is a Proxy): the lowered model checks its own inputs, and a check
    in the graph would hide the projections from the fusion pass.
    """
    if isinstance(x, torch.fx.Proxy):
        return
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != dim:
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"`{kind}` layer expects x of shape [B, T, D] with D = {dim}, got {got}")
    if not x.is_floating_point():
        raise ValueError(f"`{kind}` layer expects a floating-point x ({dtype}), got {x.dtype}")
    if x.dtype != dtype and not _autocast(x):
        raise ValueError(f"`{kind}` layer expects x in its parameters' dtype {dtype}, got {x.dtype}")


def conv_silu(
    module: nn.Module, x: torch.Tensor, name: str, entry, width: int, cu_seqlens=None
) -> torch.Tensor:
    """fla's q/k/v path: `<name>_conv1d` short conv + SiLU of `x [B, T, C]`, its last W−1 inputs
    cached as `<name>_conv`; SiLU alone when `width == 0` (fla without short convs)."""
    if width == 0:
        return F.silu(x)
    weight = getattr(module, f"{name}_conv1d").weight
    return short_conv(x, weight, None, entry, f"{name}_conv", cu_seqlens=cu_seqlens)


def conv_qkv(module: nn.Module, x: torch.Tensor, entry, v_heads: int, v_dim: int, cu_seqlens=None):
    """fla's delta-rule q, k, v from x `[B, T, D]`: `q_proj`/`k_proj`/`v_proj` of `module`, each
    through `conv_silu` (width `module.W`) → q, k `[B, T, H, K]` (`module.H`, `module.K`), v
    `[B, T, v_heads, v_dim]`."""
    H, K, W = module.H, module.K, module.W
    q = conv_silu(module, module.q_proj(x), "q", entry, W, cu_seqlens).unflatten(-1, (H, K))
    k = conv_silu(module, module.k_proj(x), "k", entry, W, cu_seqlens).unflatten(-1, (H, K))
    v = conv_silu(module, module.v_proj(x), "v", entry, W, cu_seqlens).unflatten(-1, (v_heads, v_dim))
    return q, k, v


def depthwise_conv(channels: int, width: int) -> nn.Conv1d:
    """A depthwise causal conv's weight holder `[C, 1, W]` without bias (PyTorch's default init, as fla)."""
    return nn.Conv1d(channels, channels, width, groups=channels, bias=False)


def add_qkv_convs(module: nn.Module, qk: int, v: int, width: int) -> None:
    """The convs `conv_qkv` runs: `q_conv1d`, `k_conv1d` over `qk` channels and `v_conv1d` over `v`,
    registered in that order (their default init draws from the RNG in it); none when `width` is 0."""
    if width > 0:
        module.q_conv1d, module.k_conv1d = depthwise_conv(qk, width), depthwise_conv(qk, width)
        module.v_conv1d = depthwise_conv(v, width)


def _autocast(x: torch.Tensor) -> bool:
    """Under autocast the layer input may legitimately differ from the parameters' dtype."""
    try:
        return torch.is_autocast_enabled(x.device.type)
    except RuntimeError:  # devices without autocast (meta)
        return False


def _requires_grad(args) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def run_stateful(op, entry, names: tuple[str, ...], state_dtype: torch.dtype, args: tuple, kwargs: dict):
    """Call `op(*args, **kwargs)` with the state `entry[names]` and store its final state there.

    Without an entry the op starts from zeros and no state is kept. The first call on an entry
    (prefill) starts from zeros and stores the final state in `state_dtype`; later calls pass
    the cached state and let the op update it in place (`inplace_final_state=True`), except when
    autograd tracks the call (in-place writes would corrupt saved tensors) or the state is held
    in a dtype the op cannot write into, where the new state replaces the old one.
    """
    if entry is None:
        return op(*args, **kwargs)[0]
    have = all(n in entry for n in names)
    init = None
    if have:
        init = tuple(entry[n] for n in names) if len(names) > 1 else entry[names[0]]
    inplace = have and not _requires_grad(args) and all(entry[n].dtype in STATE_DTYPES for n in names)
    o, final = op(*args, initial_state=init, output_final_state=True, inplace_final_state=inplace, **kwargs)
    if not inplace:
        finals = final if isinstance(final, tuple) else (final,)
        for n, s in zip(names, finals):
            entry[n] = s.detach().to(state_dtype)
    return o


@leaf
def gated_delta_rule_core(
    q, k, v, g, beta, entry, *, scale: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None
):
    """GDN core (mixers.md §5(b)) with q, k L2-normalised in the op; state `entry["state"]` `[B, HV, K, V]`.

    q, k `[B, T, H, K]`; v `[B, T, HV, V]`; g (log decay), beta `[B, T, HV]`. Returns `[B, T, HV, V]`.
    """
    kw = {"scale": scale, "use_qk_l2norm_in_kernel": True, "backend": backend, "cu_seqlens": cu_seqlens}
    return run_stateful(gated_delta_rule, entry, ("state",), state_dtype, (q, k, v, g, beta), kw)


@leaf
def delta_rule_core(
    q, k, v, beta, entry, *, scale: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None
):
    """DeltaNet core (mixers.md §4(b)), q, k L2-normalised in the op. Shapes as `gated_delta_rule_core`."""
    kw = {"scale": scale, "use_qk_l2norm_in_kernel": True, "backend": backend, "cu_seqlens": cu_seqlens}
    return run_stateful(delta_rule, entry, ("state",), state_dtype, (q, k, v, beta), kw)


@leaf
def kda_core(
    q, k, v, g, beta, entry, *, scale: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None
):
    """KDA core (mixers.md §6(b)), q, k L2-normalised in the op; g `[B, T, HV, K]` per-channel log decay."""
    kw = {"scale": scale, "use_qk_l2norm_in_kernel": True, "backend": backend, "cu_seqlens": cu_seqlens}
    return run_stateful(kda, entry, ("state",), state_dtype, (q, k, v, g, beta), kw)


@leaf
def gla_core(q, k, v, g, entry, *, scale: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None):
    """GLA core (mixers.md §3(b)): q, k `[B, T, H, K]`, v `[B, T, H, V]`, g `[B, T, H, K]` log decay."""
    kw = {"scale": scale, "backend": backend, "cu_seqlens": cu_seqlens}
    return run_stateful(gla, entry, ("state",), state_dtype, (q, k, v, g), kw)


@leaf
def simple_gla_core(
    q, k, v, g, entry, *, scale: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None
):
    """Scalar-decay linear attention (RetNet, Mamba2, linear attention): g `[B, T, HV]` or None."""
    kw = {"scale": scale, "backend": backend, "cu_seqlens": cu_seqlens}
    return run_stateful(simple_gla, entry, ("state",), state_dtype, (q, k, v, g), kw)


@leaf
def mlstm_core(
    q, k, v, i, f, entry, *, scale: float, eps: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None
):
    """mLSTM cell (mixers.md §8(b)); state (`C` `[B, H, K, V]`, `n` `[B, H, K]`, `m` `[B, H]`)."""
    kw = {"scale": scale, "eps": eps, "backend": backend, "cu_seqlens": cu_seqlens}
    return run_stateful(mlstm, entry, ("C", "n", "m"), state_dtype, (q, k, v, i, f), kw)


@leaf
def xpos_rotate(
    x: torch.Tensor, pos: int | RowPositions, cu_seqlens: torch.Tensor | None = None
) -> torch.Tensor:
    """RetNet's rotation (mixers.md §2(a)) of `x [B, T, H, K]` at absolute positions pos … pos+T−1.

    Pair (2j, 2j+1) turns by n·θ_j, θ_j = 10000^(−j/(K/2−1)) (torchscale's linspace(0, 1, K/2)
    exponents); positions start at 0 (at every document start of a packed row with `cu_seqlens`).
    Computed in fp32 (float64 for float64 inputs).
    """
    if isinstance(pos, RowPositions):
        return pos.xpos((x,), "reference")[0]
    return xpos_at(x, _xpos_positions(x, pos, cu_seqlens))


def xpos_rotate_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    pos: int | RowPositions,
    cu_seqlens: torch.Tensor | None = None,
    *,
    backend: str = "reference",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`xpos_rotate` of q and k `[B, T, H, K]` at the same positions. Returns (q, k) rotated.

    One graph node (`xpos_pair`) read by index, as `functional.apply_rope_qk` (a traced tuple
    unpacked would keep a decode cache alive). A decode step through a static cache (`pos` a
    `RowPositions`) turns both in one launch on the Triton path of `backend` (angles gathered from
    a table of `xpos_angles`, equal to `xpos_at`'s up to fp32 rounding of the products); every
    other call runs `xpos_at`.
    """
    qk = xpos_pair(q, k, pos, cu_seqlens, backend=backend)
    return qk[0], qk[1]


@leaf
def xpos_pair(q, k, pos, cu_seqlens=None, *, backend: str = "reference"):
    """The leaf of `xpos_rotate_qk`: (q, k) rotated."""
    if isinstance(pos, RowPositions):
        return pos.xpos((q, k), backend)
    positions = _xpos_positions(q, pos, cu_seqlens)
    return xpos_at(q, positions), xpos_at(k, positions)


def _xpos_positions(x: torch.Tensor, pos: int, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """The positions `[T]` of x's tokens: pos onward, or from 0 at each document start."""
    if cu_seqlens is not None:
        return packed.positions(cu_seqlens, x.shape[1])
    return torch.arange(pos, pos + x.shape[1], device=x.device)


def xpos_angles(K: int, positions: torch.Tensor, dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) `[*positions.shape, K/2]` in `dt` of the angles n·θ_j of `xpos_rotate` at the
    integer `positions`. Elementwise in the positions, so a table built over 0 … P−1 holds at row n
    exactly what a call at position n computes."""
    theta = 1.0 / 10000 ** torch.linspace(0, 1, K // 2, dtype=dt, device=positions.device)
    ang = positions.to(dt)[..., None] * theta
    return ang.cos(), ang.sin()


def xpos_at(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`xpos_rotate` of x `[B, T, H, K]` at `positions` `[T]` (shared by the rows) or `[B, T]`."""
    dt = compute_dtype(x)
    cos, sin = (t.unsqueeze(-2) for t in xpos_angles(x.shape[-1], positions, dt))  # [(B,) T, 1, K/2]
    xf = x.to(dt)
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(-2).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """RMSNorm over groups of `group` channels with weight `[dim]`, optionally gated.

    `norm_before_gate=True` is fla's `FusedRMSNormGated`: RMSNorm(o) ⊙ act(g) (mixers.md §0);
    False is Mamba2's: RMSNorm(o ⊙ act(g)) (§7(a)). `act` is "silu", "sigmoid" or None (no gate).
    Computed in fp32 (float64 for a float64 module), returned in the parameters' dtype.
    """

    def __init__(
        self,
        dim: int,
        eps: float,
        act: str | None = "silu",
        group: int | None = None,
        norm_before_gate: bool = True,
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.act, self.norm_before_gate = eps, act, norm_before_gate
        self.group = group or dim

    def forward(self, o: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        """o, g `[..., dim]` -> `[..., dim]`."""
        dt = math_dtype(self)
        y = o.to(dt)
        gate = None if self.act is None else self._act(g.to(dt))
        if gate is not None and not self.norm_before_gate:
            y = y * gate
        y = y.unflatten(-1, (-1, self.group))
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
        y = y * self.weight.to(dt)
        if gate is not None and self.norm_before_gate:
            y = y * gate
        return y.to(param_dtype(self))

    def _act(self, g: torch.Tensor) -> torch.Tensor:
        return F.silu(g) if self.act == "silu" else torch.sigmoid(g)


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """softplus⁻¹(y) = y + log(−expm1(−y)) (mixers.md §5(a))."""
    return y + torch.log(-torch.expm1(-y))


def init_dt_bias(p: torch.Tensor, dt_min: float = 1e-3, dt_max: float = 0.1, floor: float = 1e-4) -> None:
    """dt_bias = softplus⁻¹(dt), dt = exp(U(log dt_min, log dt_max)) clamped ≥ floor (GDN, KDA, Mamba2)."""
    with torch.no_grad():
        u = torch.rand_like(p)
        dt = torch.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
        p.copy_(inverse_softplus(dt))


def init_A_log(p: torch.Tensor, lo: float, hi: float) -> None:
    """A_log = log A, A ~ U(lo, hi) (fla GDN: (0, 16); KDA and Mamba2: (1, 16))."""
    with torch.no_grad():
        # the clamp only guards against drawing exactly 0 from U(0, 16) (log 0 = −inf)
        p.copy_(torch.empty_like(p).uniform_(lo, hi).clamp(min=1e-6).log())


def init_linears(module: nn.Module, std: float = 0.02) -> None:
    """normal(0, std) on every nn.Linear weight of `module`, zero biases (the project's default)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
