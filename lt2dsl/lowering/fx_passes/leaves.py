"""Leaf functions the fused graph calls where a fused op touches a cache entry or a core op.

* `conv_silu_cached`: the fused short conv with exactly the cache behaviour of
  `lowering.functional.short_conv` (reads `entry[key]`, the last W−1 inputs `[B, C, W−1]`, and
  stores the new ones in the activation dtype), so prefill + decode still equals a full forward.
  A decode step (one token, a history held in x's dtype, no autograd) runs the step kernel, which
  shifts the history in place: one launch, no concatenation and no copy into the cache.
* `conv_silu_group_cached`: a delta-rule layer's q, k, v convs as one node; their decode step is
  one launch for all three.
* `*_core_normed`: the delta-rule cores with q and k already L2-normalised (by the conv kernel),
  i.e. `use_qk_l2norm_in_kernel=False`; everything else as the lowering's leaves.
* `gated_delta_rule_core_gates`: the GDN core fed by `fused.gdn_gate` as one node; a decode step
  whose fp32 state the entry holds forms the gates in the recurrent kernel (one launch).
* `rope_append_cached`: RoPE of q and k with the appends of k (and v) to the cache as one node; a
  static cache's decode step writes them from the RoPE kernel (`fused.rope_cache`, one launch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lt2dsl.kernels import fused
from lt2dsl.kernels.delta import delta_rule, gated_delta_rule, kda
from lt2dsl.kernels.delta.gates import gates_in_kernel, gdn_decode_gates
from lt2dsl.lowering import functional as lf
from lt2dsl.lowering import functional_recurrent as fr
from lt2dsl.lowering import packed
from lt2dsl.lowering.cache import RowPositions, StaticEntry
from lt2dsl.lowering.leaf import leaf


@leaf
def conv_silu_cached(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    entry,
    key: str,
    head_dim: int = 0,
    backend: str = "auto",
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """`short_conv(x, weight, bias, entry, key)` (SiLU) through the fused kernel, L2-normalising
    each head of `head_dim` channels when > 0. x `[B, T, C]` → `[B, T, C]`. With `cu_seqlens`
    (a packed row, no entry) every document starts from a zero history."""
    W = weight.shape[-1]
    if cu_seqlens is not None:
        xp, index = packed.pad_documents(x, cu_seqlens, W - 1)
        return fused.conv_silu(xp, weight, bias, None, head_dim=head_dim, backend=backend)[:, index]
    hist = entry[key] if entry is not None and key in entry else None
    if _steps_in_place(x, hist, W):
        return fused.conv_silu_step([x], [weight], [bias], [hist], head_dims=[head_dim], backend=backend)[0]
    y = fused.conv_silu(x, weight, bias, hist, head_dim=head_dim, backend=backend)
    if entry is not None and W > 1:
        entry[key] = _next_hist(x, hist, W)
    return y


@leaf
def conv_silu_group_cached(
    xs: tuple[torch.Tensor, ...],
    weights: tuple[torch.Tensor, ...],
    biases: tuple[torch.Tensor | None, ...],
    entry,
    keys: tuple[str, ...],
    head_dims: tuple[int, ...],
    backend: str = "auto",
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """`conv_silu_cached` of each (x, weight, bias, key, head_dim), up to three: a decode step of
    all of them is one kernel (`fused.conv_silu_step`), anything else one call each."""
    hists = [entry[k] if entry is not None and k in entry else None for k in keys]
    W = weights[0].shape[-1]
    if cu_seqlens is None and all(_steps_in_place(x, h, W) for x, h in zip(xs, hists)):
        return fused.conv_silu_step(xs, weights, biases, hists, head_dims=head_dims, backend=backend)
    return tuple(
        conv_silu_cached(x, w, b, entry, k, hd, backend, cu_seqlens)
        for x, w, b, k, hd in zip(xs, weights, biases, keys, head_dims, strict=True)
    )


def _steps_in_place(x: torch.Tensor, hist: torch.Tensor | None, W: int) -> bool:
    """A decode step whose history can be shifted in place: one token, a history of x's dtype, no
    autograd (a graph may have saved the history), no inference tensor outside inference mode."""
    if hist is None or W < 2 or x.shape[1] != 1 or hist.dtype != x.dtype:
        return False
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    return not hist.is_inference() or torch.is_inference_mode_enabled()


def _next_hist(x: torch.Tensor, hist: torch.Tensor | None, W: int) -> torch.Tensor:
    """The last W−1 inputs `[B, C, W−1]` after x (older ones from `hist`, zeros before the start)."""
    xt = x.detach().transpose(1, 2)  # [B, C, T]
    T = xt.shape[-1]
    if T < W - 1:
        if hist is None:
            hist = xt.new_zeros(xt.shape[0], xt.shape[1], W - 1)
        # exactly the newest W−1 inputs, already a fresh contiguous tensor: a decode step's
        # history update is this one cat, with no clone after it
        return torch.cat([hist[..., T:].to(xt.dtype), xt], dim=-1)
    return xt[..., T - (W - 1) :].clone(memory_format=torch.contiguous_format)


def _normed(op, q, k, v, g, beta, entry, scale, backend, state_dtype, cu_seqlens):
    kw = {"scale": scale, "use_qk_l2norm_in_kernel": False, "backend": backend, "cu_seqlens": cu_seqlens}
    args = (q, k, v, beta) if g is None else (q, k, v, g, beta)
    return fr.run_stateful(op, entry, ("state",), state_dtype, args, kw)


@leaf
def gated_delta_rule_core_normed(
    q, k, v, g, beta, entry, *, scale: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None
):
    """`gated_delta_rule_core` for q, k that are already L2-normalised."""
    return _normed(gated_delta_rule, q, k, v, g, beta, entry, scale, backend, state_dtype, cu_seqlens)


@leaf
def delta_rule_core_normed(
    q, k, v, beta, entry, *, scale: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None
):
    """`delta_rule_core` for q, k that are already L2-normalised."""
    return _normed(delta_rule, q, k, v, None, beta, entry, scale, backend, state_dtype, cu_seqlens)


@leaf
def kda_core_normed(
    q, k, v, g, beta, entry, *, scale: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None
):
    """`kda_core` for q, k that are already L2-normalised."""
    return _normed(kda, q, k, v, g, beta, entry, scale, backend, state_dtype, cu_seqlens)


@leaf
def gated_delta_rule_core_gates(
    q, k, v, a, b, A_log, dt_bias, entry, *, beta_scale: float, gate_dtype: torch.dtype, gate_backend: str,
    l2norm: bool, scale: float, backend: str, state_dtype: torch.dtype, cu_seqlens=None,
):  # fmt: skip
    """`core(q, k, v, *fused.gdn_gate(a, b, A_log, dt_bias), entry)`, the core L2-normalising q, k
    when `l2norm` (`fr.gated_delta_rule_core`) or not (`gated_delta_rule_core_normed`).

    When the entry holds the state in fp32 and the call is the recurrent kernel's (a few tokens, no
    gradient, Triton), the gates are formed in that kernel and the state updated in place: what
    the two calls compute, in one launch (`kernels.delta.gates`)."""
    state = entry["state"] if entry is not None and "state" in entry else None
    fold = cu_seqlens is None and gate_dtype == torch.float32 and not torch.compiler.is_compiling()
    if fold and gates_in_kernel(q, a, state, backend):
        return gdn_decode_gates(
            q, k, v, a, b, A_log, dt_bias, state, beta_scale=beta_scale, scale=scale,
            use_qk_l2norm_in_kernel=l2norm, backend=backend,
        )  # fmt: skip
    gate_kw = {"beta_scale": beta_scale, "dtype": gate_dtype, "backend": gate_backend}
    g, beta = fused.gdn_gate(a, b, A_log, dt_bias, **gate_kw)
    core = fr.gated_delta_rule_core if l2norm else gated_delta_rule_core_normed
    kw = {"scale": scale, "backend": backend, "state_dtype": state_dtype, "cu_seqlens": cu_seqlens}
    return core(q, k, v, g, beta, entry, **kw)


@leaf
def rope_append_cached(
    q, k, v, entry, pos, theta: float, scaling, cu_seqlens, norm_weight=None, norm_bias=None, *,
    norm_eps: float = 0.0, dims: int | None, keys: tuple[str, ...], dim: int, keep: int | None, backend: str,
):  # fmt: skip
    """`rope_pair(q, k)` and `append_cache` of k (and v) into `entry`: (q turned, k's cached tensor,
    v's cached tensor or None), as the lowering's nodes return them.

    q `[B, T, Hq, D]`; k `[B, T, Hk, D]`, LayerNorm-ed over D first with `norm_weight` (and
    `norm_bias`, `norm_eps`); v `[B, T, Hk, D]` or None. `keys` name k's (and v's) cache tensors;
    `dim` 2 appends k.transpose(1, 2) to a `[B, Hk, L, D]` tensor, `dim` 1 k.squeeze(2) (one head)
    to a `[B, L, D]` one; `keep` is a ring's window. A static cache's decode step writes k and v at
    each row's slot from the RoPE kernel (`fused.rope_cache`)."""
    norm = None if norm_weight is None else (norm_weight, norm_bias, norm_eps)
    if _rope_into_cache(q, k, entry, pos, cu_seqlens, dims):
        R = k.shape[-1] if dims is None else dims
        c, s = pos.rope_rows(R, theta, torch.float32, scaling)
        k_all = entry[keys[0]]
        v_all = entry[keys[1]] if v is not None else None
        kc = k_all if dim == 2 else k_all.unsqueeze(1)
        ring = keep is not None
        yq = fused.rope_cache(q, k, v, c, s, kc, v_all, pos.rows(), ring=ring, norm=norm, backend=backend)
        return yq, k_all, v_all
    if norm is not None:
        k = F.layer_norm(k, (k.shape[-1],), *norm)
    q, k = lf.rope_pair(q, k, pos, theta, scaling, cu_seqlens, dims=dims, backend=backend)
    k_all = lf.append_cache(entry, keys[0], k.transpose(1, 2) if dim == 2 else k.squeeze(2), dim, keep)
    v_all = None if v is None else lf.append_cache(entry, keys[1], v.transpose(1, 2), dim, keep)
    return q, k_all, v_all


def _rope_into_cache(q, k, entry, pos, cu_seqlens, dims: int | None) -> bool:
    """A static cache's decode step (one token per row at per-row positions) with no autograd to
    record, a rotation to do and no float64 (which has no kernel)."""
    if not (isinstance(pos, RowPositions) and isinstance(entry, StaticEntry)) or cu_seqlens is not None:
        return False
    if q.shape[1] != 1 or dims == 0 or q.dtype == torch.float64 or torch.compiler.is_compiling():
        return False
    return not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))


# the lowering's cores that L2-normalise q and k inside the op → their variants without
NORMED_CORES = {
    fr.gated_delta_rule_core: gated_delta_rule_core_normed,
    fr.delta_rule_core: delta_rule_core_normed,
    fr.kda_core: kda_core_normed,
}
