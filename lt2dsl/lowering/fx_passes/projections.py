"""Rule `norm_proj`: a normed activation read only by projections → one concatenated GEMM.

    n = norm(x); q = W_q n; k = W_k n; ...   ->   q, k, ... = split(n @ cat(W_q, W_k, ...)ᵀ)

The norm stays one op (an `nn.RMSNorm` / `nn.LayerNorm` call, or the normed output of a fused
`add_rmsnorm` / `norm_add_rmsnorm`); its projections (q, k, v, gates, β, decay, indexer, or an
MLP's gate and up) become one GEMM whose weight is `torch.cat` of the original parameters, built
once per forward at the top of the graph (a loop's iterations share it; gradients reach the
original parameters through the cat; without autograd the cat is cached, see
`kernels.fused.concat_weights`). The rule needs every user of the normed tensor to be a projection
of it, so the normed activation exists only for this GEMM (the precondition for moving the norm
into its prologue later); a tensor with any other reader is left alone.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.node import Node

from lt2dsl.kernels import fused

from .manager import Ctx, Match, Rule, is_call

ALGEBRA = "W_1 n, ..., W_k n -> split(cat(W_1, ..., W_k) n)"


Biases = list[torch.Tensor | None] | None


def pattern(x: torch.Tensor, weights: list[torch.Tensor], biases: Biases = None):
    bs = biases if biases is not None else [None] * len(weights)
    return tuple(F.linear(x, w, b) for w, b in zip(weights, bs))


def replacement(x: torch.Tensor, weights: list[torch.Tensor], biases: Biases = None):
    sizes = [w.shape[0] for w in weights]
    b = fused.concat_biases(sizes, *biases) if biases is not None else None
    return fused.linear_split(x, fused.concat_weights(*weights), b, sizes)


def is_normed(ctx: Ctx, node: Node) -> bool:
    """An `nn.RMSNorm` / `nn.LayerNorm` call, or the normed output of a fused add-norm."""
    if ctx.module(node, (nn.RMSNorm, nn.LayerNorm)) is not None:
        return True
    if not (is_call(node, operator.getitem) and node.args[1] == 0):
        return False
    return is_call(node.args[0], fused.add_rmsnorm, fused.norm_add_rmsnorm)


def match(ctx: Ctx, node: Node) -> Match | None:
    if not is_normed(ctx, node) or len(node.users) < 2:
        return None
    users = ctx.users_in_order(node)
    mods = [ctx.module(u, nn.Linear) for u in users]
    if any(m is None for m in mods) or any(u.args != (node,) or u.kwargs for u in users):
        return None
    w0 = mods[0].weight
    if any(m.weight.shape[1] != w0.shape[1] or m.weight.dtype != w0.dtype for m in mods):
        return None
    biases = tuple(f"{u.target}.bias" if m.bias is not None else None for u, m in zip(users, mods))
    sizes = tuple(m.weight.shape[0] for m in mods)
    return {"x": node, "users": users, "sizes": sizes, "biases": biases}


def rewrite(ctx: Ctx, m: Match) -> None:
    users = m["users"]
    weight = ctx.concat(tuple(f"{u.target}.weight" for u in users))
    has_bias = any(b is not None for b in m["biases"])
    bias = ctx.concat(m["biases"], m["sizes"]) if has_bias else None
    with ctx.graph.inserting_after(m["x"]):
        split = ctx.graph.call_function(fused.linear_split, (m["x"], weight, bias, m["sizes"]))
    prev = split
    for i, u in enumerate(users):
        with ctx.graph.inserting_after(prev):
            prev = ctx.graph.call_function(operator.getitem, (split, i))
        u.replace_all_uses_with(prev)
    ctx.erase(*users)


RULE = Rule("norm_proj", ALGEBRA, pattern, replacement, match, rewrite)
