"""Rules `conv_silu_l2norm` and `conv_silu`: the short causal conv + SiLU (+ the q/k L2Norm).

    y = silu(conv(x)); core(l2norm(y_q), l2norm(y_k), ...)   ->   core'(conv_silu(x_q, head_dim=K), ...)
    y = silu(conv(x))                                        ->   y = conv_silu(x)

`lowering.functional.short_conv` runs the conv as cat + conv1d + SiLU (three kernels and their
backward), and the delta-rule cores (gdn, kda, deltanet) L2-normalise q and k in the op (more
kernels in the Triton path, whose L2Norm is plain PyTorch). `conv_silu_l2norm` needs both q and
k of such a core to come from short convs (through `unflatten(-1, (H, K))`) that nothing else
reads; it moves the L2Norm into those convs' kernel and calls the core variant without it
(`leaves.NORMED_CORES`). `conv_silu` then takes every remaining SiLU short conv (v, Mamba2's
xBC): the leaf is replaced by the one-kernel op; it has no intermediate node of its own, so its
negative case is a conv whose activation is not SiLU. Both keep the conv's decode cache exactly
(`leaves.conv_silu_cached`).
"""

from __future__ import annotations

from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.common.norm import l2norm
from lt2dsl.kernels.fused import naive
from lt2dsl.lowering import functional

from .leaves import NORMED_CORES, conv_silu_cached
from .manager import Ctx, Match, Rule, is_call, is_method, only_user

ALGEBRA_L2 = "core(l2(silu(conv(x_q))), l2(silu(conv(x_k)))) -> core'(conv_silu_l2(x_q), conv_silu_l2(x_k))"
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


def match_l2(ctx: Ctx, node: Node) -> Match | None:
    if not (isinstance(node, Node) and node.op == "call_function" and node.target in NORMED_CORES):
        return None
    q, k = _head_conv(node.args[0], node), _head_conv(node.args[1], node)
    if q is None or k is None:
        return None
    return {"core": node, "convs": [q, k]}


def _fused_conv(ctx: Ctx, conv: Node, head_dim: int, backend: str) -> None:
    x, weight, bias, entry, key = conv.args[:5]
    kwargs = {"head_dim": head_dim, "backend": backend, "cu_seqlens": conv.kwargs.get("cu_seqlens")}
    with ctx.graph.inserting_before(conv):
        new = ctx.graph.call_function(conv_silu_cached, (x, weight, bias, entry, key), kwargs)
    conv.replace_all_uses_with(new)
    ctx.erase(conv)


def rewrite_l2(ctx: Ctx, m: Match) -> None:
    core = m["core"]
    backend = core.kwargs.get("backend", ctx.backend)
    for conv, _, K in m["convs"]:
        _fused_conv(ctx, conv, K, backend)
    core.target = NORMED_CORES[core.target]


def match(ctx: Ctx, node: Node) -> Match | None:
    return {"conv": node} if _silu_conv(node) else None


def rewrite(ctx: Ctx, m: Match) -> None:
    _fused_conv(ctx, m["conv"], 0, ctx.backend)


RULE_L2 = Rule("conv_silu_l2norm", ALGEBRA_L2, pattern_l2, replacement_l2, match_l2, rewrite_l2)
RULE = Rule("conv_silu", ALGEBRA, pattern, replacement, match, rewrite)
