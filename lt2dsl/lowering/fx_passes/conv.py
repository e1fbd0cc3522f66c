"""Rules `conv_silu_l2norm` and `conv_silu`: the short causal conv + SiLU (+ the q/k L2Norm).

    core(l2(silu(conv(x_q))), l2(silu(conv(x_k))), silu(conv(x_v)), ...)
        ->   q, k, v = conv_silu_group(x_q, x_k, x_v; head_dims=(K, K, 0));  core'(q, k, v, ...)
    y = silu(conv(x))   ->   y = conv_silu(x)

`lowering.functional.short_conv` runs the conv as cat + conv1d + SiLU (three kernels and their
backward), and the delta-rule cores (gdn, kda, deltanet) L2-normalise q and k in the op (more
kernels in the Triton path, whose L2Norm is plain PyTorch). `conv_silu_l2norm` needs both q and
k of such a core to come from short convs (through `unflatten(-1, (H, K))`) that nothing else
reads; it moves the L2Norm into those convs' kernel and calls the core variant without it
(`leaves.NORMED_CORES`). When v too comes from such a conv, it joins them: the three convs become
one node (`leaves.conv_silu_group_cached`), whose decode step is one launch. The node sits just
before the core and the views (`unflatten`) move after it: they are read by the core alone.
`conv_silu` then takes every remaining SiLU short conv (Mamba2's xBC, a v left out): the leaf is
replaced by the one-kernel op; it has no intermediate node of its own, so its negative case is a
conv whose activation is not SiLU. Both keep the conv's decode cache exactly
(`leaves.conv_silu_cached`).
"""

from __future__ import annotations

import operator

from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.common.norm import l2norm
from lt2dsl.kernels.fused import naive
from lt2dsl.lowering import functional

from .leaves import NORMED_CORES, conv_silu_cached, conv_silu_group_cached
from .manager import Ctx, Match, Rule, is_call, is_method, only_user

ALGEBRA_L2 = "core(l2(silu(conv(q))), l2(silu(conv(k))), [silu(conv(v))]) -> core'(*conv_group(q, k[, v]))"
ALGEBRA = "silu(conv(x)) -> conv_silu(x)"


def pattern_l2(x, weight, bias, hist, head_dim: int):
    y = naive.conv_silu_ref(x, weight, bias, hist)
    return l2norm(y.unflatten(-1, (-1, head_dim))).flatten(-2)


def replacement_l2(x, weight, bias, hist, head_dim: int, backend: str = "auto"):
    return fused.conv_silu(x, weight, bias, hist, head_dim=head_dim, backend=backend)


def pattern(x, weight, bias, hist):
    return naive.conv_silu_ref(x, weight, bias, hist)


def replacement(x, weight, bias, hist, backend: str = "auto"):
    return fused.conv_silu(x, weight, bias, hist, backend=backend)


def _silu_conv(node) -> bool:
    """A `short_conv(x, w, b, entry, key[, activation], cu_seqlens=...)` call with SiLU."""
    if not is_call(node, functional.short_conv) or not 5 <= len(node.args) <= 6:
        return False
    act = node.args[5] if len(node.args) > 5 else node.kwargs.get("activation", "silu")
    return act == "silu" and set(node.kwargs) <= {"activation", "cu_seqlens"}


def _head_conv(arg, core: Node) -> tuple[Node, Node, int] | None:
    """q or k = short_conv(...).unflatten(-1, (H, K)) read by the core alone → (conv, view, K)."""
    if not (is_method(arg, "unflatten") and only_user(arg, core) and arg.args[1] == -1):
        return None
    shape = arg.args[2]
    conv = arg.args[0]
    if not (isinstance(shape, tuple | list) and len(shape) == 2):
        return None
    if not (_silu_conv(conv) and only_user(conv, arg)):
        return None
    return conv, arg, int(shape[1])


def _same_cache(a: Node, b: Node) -> bool:
    """Two convs of one cache entry and one packing (`cu_seqlens`)."""
    return a.args[3] is b.args[3] and a.kwargs.get("cu_seqlens") is b.kwargs.get("cu_seqlens")


def match_l2(ctx: Ctx, node: Node) -> Match | None:
    if not (isinstance(node, Node) and node.op == "call_function" and node.target in NORMED_CORES):
        return None
    q, k = _head_conv(node.args[0], node), _head_conv(node.args[1], node)
    if q is None or k is None or not _same_cache(q[0], k[0]):
        return None
    v = _head_conv(node.args[2], node)
    if v is not None and v[0] is not q[0] and v[0] is not k[0] and _same_cache(q[0], v[0]):
        return {"core": node, "convs": [q, k, (v[0], v[1], 0)]}
    return {"core": node, "convs": [q, k]}


def _fused_conv(ctx: Ctx, conv: Node, head_dim: int, backend: str) -> None:
    x, weight, bias, entry, key = conv.args[:5]
    kwargs = {"head_dim": head_dim, "backend": backend, "cu_seqlens": conv.kwargs.get("cu_seqlens")}
    with ctx.graph.inserting_before(conv):
        new = ctx.graph.call_function(conv_silu_cached, (x, weight, bias, entry, key), kwargs)
    conv.replace_all_uses_with(new)
    ctx.erase(conv)


def rewrite_l2(ctx: Ctx, m: Match) -> None:
    core, convs = m["core"], m["convs"]
    backend = core.kwargs.get("backend", ctx.backend)
    xs, weights, biases = (tuple(c.args[i] for c, _, _ in convs) for i in range(3))
    entry = convs[0][0].args[3]
    keys, head_dims = tuple(c.args[4] for c, _, _ in convs), tuple(hd for _, _, hd in convs)
    kwargs = {"head_dims": head_dims, "backend": backend, "cu_seqlens": convs[0][0].kwargs.get("cu_seqlens")}
    with ctx.graph.inserting_before(core):
        group = ctx.graph.call_function(conv_silu_group_cached, (xs, weights, biases, entry, keys), kwargs)
        outs = [ctx.graph.call_function(operator.getitem, (group, i)) for i in range(len(convs))]
    for (conv, view, _), out in zip(convs, outs):
        conv.replace_all_uses_with(out)
        ctx.erase(conv)
        core.prepend(view)  # read by the core alone: after the group, still before the core
    core.target = NORMED_CORES[core.target]


def match(ctx: Ctx, node: Node) -> Match | None:
    return {"conv": node} if _silu_conv(node) else None


def rewrite(ctx: Ctx, m: Match) -> None:
    _fused_conv(ctx, m["conv"], 0, ctx.backend)


RULE_L2 = Rule("conv_silu_l2norm", ALGEBRA_L2, pattern_l2, replacement_l2, match_l2, rewrite_l2)
RULE = Rule("conv_silu", ALGEBRA, pattern, replacement, match, rewrite)
