"""Rules `norm_add_rmsnorm` and `add_rmsnorm`: a residual add and the RMSNorm that reads it → one
fused add-norm; in a sandwich block (Ouro) the branch's own RMSNorm before the add joins them.

    s = x + RMSNorm₁(y); n = RMSNorm₂(s)   ->   n, s = norm_add_rmsnorm(x, y, γ₁, ε₁, γ₂, ε₂)
    s = x + r; n = RMSNorm(s)             ->   n, s = add_rmsnorm(x, r, γ, eps)

Between blocks this is the MLP's (or mixer's) residual add and the next block's pre-norm, inside
a block the mixer's residual add and the MLP's norm; a loop's `final_norm` after an add fuses
too. The sum keeps its other users (the next residual add): the fused op returns it. A sum
normalised by two norms is left alone (the fused op returns one normed value).
`norm_add_rmsnorm` runs first and needs the branch norm's output read by the add alone; its
kernel is for inference (a call autograd records runs the branch norm and `add_rmsnorm`).
"""

from __future__ import annotations

import operator

import torch
from torch import nn
from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive

from .manager import Ctx, Match, Rule, is_add, only_user

ALGEBRA = "rmsnorm(x + r) -> add_rmsnorm(x, r) = (rmsnorm(x + r), x + r)"
ALGEBRA_PRE = "rmsnorm2(x + rmsnorm1(y)) -> norm_add_rmsnorm(x, y) = (rmsnorm2(s), s), s = x + rmsnorm1(y)"


def pattern(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float):
    return naive.add_rmsnorm_ref(x, r, weight, eps)


def replacement(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "auto"):
    return fused.add_rmsnorm(x, r, weight, eps, backend=backend)


def match(ctx: Ctx, node: Node) -> Match | None:
    norm = ctx.module(node, nn.RMSNorm)
    if norm is None or norm.weight is None or len(node.args) != 1 or node.kwargs:
        return None
    add = node.args[0]
    if not is_add(add) or not all(isinstance(a, Node) for a in add.args):
        return None
    if sum(ctx.module(u, nn.RMSNorm) is not None for u in add.users) != 1:
        return None
    return {"norm": node, "add": add, "eps": norm.eps}


def rewrite(ctx: Ctx, m: Match) -> None:
    norm, add = m["norm"], m["add"]
    x, r = add.args
    with ctx.graph.inserting_before(add):
        weight = ctx.param(f"{norm.target}.weight")
        both = ctx.graph.call_function(fused.add_rmsnorm, (x, r, weight, m["eps"]), {"backend": ctx.backend})
        normed = ctx.graph.call_function(operator.getitem, (both, 0))
        total = ctx.graph.call_function(operator.getitem, (both, 1))
    norm.replace_all_uses_with(normed)
    add.replace_all_uses_with(total)
    ctx.erase(norm, add)


RULE = Rule("add_rmsnorm", ALGEBRA, pattern, replacement, match, rewrite)


def pattern_pre(x, y, w1, eps1: float, w2, eps2: float):
    return naive.norm_add_rmsnorm_ref(x, y, w1, eps1, w2, eps2)


def replacement_pre(x, y, w1, eps1: float, w2, eps2: float, backend: str = "auto"):
    return fused.norm_add_rmsnorm(x, y, w1, eps1, w2, eps2, backend=backend)


def match_pre(ctx: Ctx, node: Node) -> Match | None:
    m = match(ctx, node)
    if m is None:
        return None
    branch = m["add"].args[1]
    norm = ctx.module(branch, nn.RMSNorm)
    if norm is None or norm.weight is None or len(branch.args) != 1 or branch.kwargs:
        return None
    if not only_user(branch, m["add"]):
        return None
    return {**m, "branch": branch, "eps1": norm.eps}


def rewrite_pre(ctx: Ctx, m: Match) -> None:
    norm, add, branch = m["norm"], m["add"], m["branch"]
    x, y = add.args[0], branch.args[0]
    with ctx.graph.inserting_before(add):
        w1, w2 = ctx.param(f"{branch.target}.weight"), ctx.param(f"{norm.target}.weight")
        args = (x, y, w1, m["eps1"], w2, m["eps"])
        both = ctx.graph.call_function(fused.norm_add_rmsnorm, args, {"backend": ctx.backend})
        normed = ctx.graph.call_function(operator.getitem, (both, 0))
        total = ctx.graph.call_function(operator.getitem, (both, 1))
    norm.replace_all_uses_with(normed)
    add.replace_all_uses_with(total)
    ctx.erase(norm, add, branch)


RULE_PRE = Rule("norm_add_rmsnorm", ALGEBRA_PRE, pattern_pre, replacement_pre, match_pre, rewrite_pre)
