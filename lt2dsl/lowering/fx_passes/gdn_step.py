"""Rule `gdn_decode` (opt-in): a GDN block's convs, gated recurrence and gated output norm → one
node whose decode step is two launches (`kernels.delta.gdn_step`) instead of three.

    q, k, v = conv_silu_group_cached((x_q, x_k, x_v), …); o = gated_delta_rule_core_gates(q, k, v, a, b, …)
    y = gated_rmsnorm_linear(o, z, γ, W_o)
        ->   y = gdn_step_linear(x_q, x_k, x_v, a, b, z, …, γ, W_o, entry)

One token per row through a cache entry that holds the fp32 state and the conv histories (the
engine's step, a dynamic cache's step), on the Triton path and without autograd: the convs run
inside the recurrence and the q/k histories' shift inside the output norm (`gdn_step`), then
`F.linear` with W_o. Everything else (prefill, training, the reference backend, float64) runs the
three nodes it replaced, in their order.

The match, from a `gated_rmsnorm_linear` node (fla's gate after the norm, SiLU, one group a value
head, no bias, n_flat 2): its o is a `gated_delta_rule_core_gates` read by it alone, whose q, k, v
are `unflatten`s of the outputs 0, 1, 2 of one `conv_silu_group_cached` of three convs (q and k
L2-normalised per head, v not), each read once. With `decode_gemv` also named this rule runs
first: GDN's o_proj then stays a cuBLAS product (decode_gemv folds the MLP's).

Off by default: on the H100 the hybrid's step is as fast with it as without (122.6 against 122.1
tok/s at B=1, 780.7 against 786.1 at B=8; s32). `lt2dsl.compile(..., opt_in=("gdn_decode",))`,
`lt2dsl bench decode ... --rules default,+gdn_decode`.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.common.backend import pick_backend
from lt2dsl.kernels.delta.gdn_step import gdn_step
from lt2dsl.lowering.leaf import leaf

from .leaves import conv_silu_group_cached, gated_delta_rule_core_gates
from .manager import Ctx, Match, Rule, is_call, is_method, only_user

ALGEBRA = "convs → core → gated norm · W_o  ->  gdn_step (convs in the recurrence, shift in the norm) · W_o"
_CORE_KW = ("beta_scale", "gate_dtype", "gate_backend", "l2norm", "scale", "backend", "state_dtype")
_CORE_KW += ("cu_seqlens",)
_NORM_KW = {"act": "silu", "norm_before_gate": True, "n_flat": 2}


def pattern(xq, xk, xv, a, b, z, ws, bs, hists, A_log, dt_bias, state, gamma, w_o, **kw):
    """The unfused references in order, then W_o (kw: heads, scale, beta_scale, eps)."""
    from lt2dsl.kernels.delta.gdn_step import gdn_step_ref

    o = gdn_step_ref(xq, xk, xv, a, b, z, ws, bs, hists, A_log, dt_bias, state, gamma, **kw)
    return F.linear(o.flatten(-2), w_o)


def replacement(xq, xk, xv, a, b, z, ws, bs, hists, A_log, dt_bias, state, gamma, w_o, **kw):
    o = gdn_step(xq, xk, xv, a, b, z, ws, bs, hists, A_log, dt_bias, state, gamma, **kw)
    return F.linear(o.flatten(-2), w_o)


@leaf
def gdn_step_linear(
    xq, xk, xv, a, b, z, wq, wk, wv, bq, bk, bv, A_log, dt_bias, gamma, w_o, entry, cu_seqlens, *,
    keys: tuple[str, ...], dims: tuple[int, int, int, int], conv_backend: str, core: dict, eps: float,
    norm_backend: str,
):  # fmt: skip
    """`gated_rmsnorm_linear(gated_delta_rule_core_gates(*conv_silu_group_cached(…)), z, γ, W_o)`:
    `gdn_step` then W_o for one token per row through an entry with an fp32 state and the conv
    histories on the Triton path, the replaced nodes otherwise. dims = (H, HV, K, V)."""
    H, HV, K, V = dims
    if _step_applies(xq, (xk, xv, a, b, z), entry, keys, cu_seqlens, core, HV, K, V):
        hists = tuple(entry[k] for k in keys)
        o = gdn_step(xq, xk, xv, a, b, z, (wq, wk, wv), (bq, bk, bv), hists, A_log, dt_bias, entry["state"],
                     gamma, heads=H, scale=core["scale"], beta_scale=core["beta_scale"], eps=eps)  # fmt: skip
        return F.linear(o.flatten(-2), w_o)
    ys = conv_silu_group_cached((xq, xk, xv), (wq, wk, wv), (bq, bk, bv), entry, keys, head_dims=(K, K, 0),
                                backend=conv_backend, cu_seqlens=cu_seqlens)  # fmt: skip
    q, k, v = ys[0].unflatten(-1, (H, K)), ys[1].unflatten(-1, (H, K)), ys[2].unflatten(-1, (HV, V))
    o = gated_delta_rule_core_gates(q, k, v, a, b, A_log, dt_bias, entry, **core)
    return fused.gated_rmsnorm_linear(o, z.unflatten(-1, (HV, V)), gamma, w_o, None, eps=eps, group=V,
                                      backend=norm_backend, **_NORM_KW)  # fmt: skip


def _step_applies(xq, others, entry, keys, cu_seqlens, core: dict, HV: int, K: int, V: int) -> bool:
    """One token per row, an entry with an fp32 contiguous state `[B, HV, K, V]` and histories of
    x's dtype, the Triton path, no autograd, no packing, fp32 gates and state."""
    if entry is None or cu_seqlens is not None or xq.shape[1] != 1 or core["l2norm"]:
        return False
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    if core["gate_dtype"] != torch.float32 or core["state_dtype"] != torch.float32:
        return False
    if pick_backend(core["backend"], xq) != "triton" or xq.dtype == torch.float64:
        return False
    state = entry.get("state")
    if state is None or state.dtype != torch.float32 or not state.is_contiguous():
        return False
    if tuple(state.shape[1:]) != (HV, K, V) or state.shape[0] != xq.shape[0]:
        return False
    for key, x in zip(keys, (xq, *others[:2])):
        h = entry.get(key)
        if h is None or h.dtype != x.dtype or h.stride(-1) != 1 or h.shape[-1] < 1:
            return False
        if h.is_inference() and not torch.is_inference_mode_enabled():
            return False
    return all(t.device == xq.device for t in others)


# ---- the graph rule ----------------------------------------------------------------------------


def _unflatten_of(node, conv: Node | None, index: int) -> tuple[Node, tuple[int, int]] | None:
    """(the conv node, (heads, dim)) when node = conv[index].unflatten(-1, (heads, dim)), read once."""
    if not (is_method(node, "unflatten") and len(node.args) == 3 and node.args[1] == -1):
        return None
    get = node.args[0]
    if not (is_call(get, operator.getitem) and get.args[1] == index and only_user(get, node)):
        return None
    if conv is not None and get.args[0] is not conv:
        return None
    return get.args[0], tuple(node.args[2])


def match(ctx: Ctx, node: Node) -> Match | None:
    if not is_call(node, fused.gated_rmsnorm_linear) or len(node.args) != 5 or node.args[4] is not None:
        return None
    kw = node.kwargs
    if any(kw.get(k) != v for k, v in _NORM_KW.items()) or set(kw) != {"eps", "group", "backend", *_NORM_KW}:
        return None
    core, zu, gamma, w_o, _ = node.args
    if not is_call(core, gated_delta_rule_core_gates) or not only_user(core, node) or len(core.args) != 8:
        return None
    if set(core.kwargs) != set(_CORE_KW) or core.kwargs["l2norm"]:
        return None
    if not (is_method(zu, "unflatten") and len(zu.args) == 3 and only_user(zu, node)):
        return None
    uq, uk, uv, a, b, A_log, dt_bias, entry = core.args
    first = _unflatten_of(uq, None, 0)
    if first is None:
        return None
    conv = first[0]
    parts = [first, _unflatten_of(uk, conv, 1), _unflatten_of(uv, conv, 2)]
    if any(p is None for p in parts) or not all(only_user(u, core) for u in (uq, uk, uv)):
        return None
    (H, K), (H2, K2), (HV, V) = (p[1] for p in parts)
    if not is_call(conv, conv_silu_group_cached) or len(conv.args) != 5 or len(conv.users) != 3:
        return None
    if tuple(conv.kwargs.get("head_dims", ())) != (K, K, 0) or (H2, K2) != (H, K) or kw["group"] != V:
        return None
    if tuple(zu.args[2]) != (HV, V) or conv.args[3] is not entry or len(conv.args[0]) != 3:
        return None
    return {"node": node, "core": core, "conv": conv, "z": zu.args[0], "gamma": gamma, "w_o": w_o,
            "dims": (H, HV, K, V), "unflattens": (uq, uk, uv, zu)}  # fmt: skip


def rewrite(ctx: Ctx, m: Match) -> None:
    node, core, conv = m["node"], m["core"], m["conv"]
    (xq, xk, xv), ws, bs, entry, keys = conv.args
    uq, uk, uv, a, b, A_log, dt_bias, _ = core.args
    kw = {"keys": tuple(keys), "dims": m["dims"], "conv_backend": conv.kwargs.get("backend", ctx.backend),
          "core": {k: core.kwargs[k] for k in _CORE_KW if k != "cu_seqlens"}, "eps": node.kwargs["eps"],
          "norm_backend": node.kwargs["backend"]}  # fmt: skip
    args = (xq, xk, xv, a, b, m["z"], *ws, *bs, A_log, dt_bias, m["gamma"], m["w_o"], entry,
            core.kwargs["cu_seqlens"])  # fmt: skip
    with ctx.graph.inserting_before(node):
        new = ctx.graph.call_function(gdn_step_linear, args, kw)
    node.replace_all_uses_with(new)
    gets = [u.args[0] for u in m["unflattens"][:3]]
    ctx.erase(node, m["unflattens"][3], core, *m["unflattens"][:3], *gets, conv)


RULE = Rule("gdn_decode", ALGEBRA, pattern, replacement, match, rewrite)
