"""Rule `dsa_w_scale`: the scale of DSA's indexer weights → an argument of the DSA core.

    dsa_attend(..., w · c, ...)   ->   dsa_attend(..., w, ..., w_scale=c)

The lowering scales the indexer weights by HI^{-1/2} (`layers/dsa.py`) with one elementwise
kernel over `[B, T, HI]` per layer and step. `dsa_attend` applies `w_scale` itself: a static
cache's decode step in the scoring kernel, rounding the product to w's dtype as the multiplication
does (`kernels.dsa.triton_indexer`), every other call by the same multiplication. The product must
be read by the core alone and the factor be a constant.
"""

from __future__ import annotations

from torch.fx.node import Node

from lt2dsl.lowering import functional_sparse as fs

from .manager import Ctx, Match, Rule, is_call, is_mul, only_user

ALGEBRA = "dsa_attend(..., w * c, ...) -> dsa_attend(..., w, ..., w_scale=c)"
W_ARG = 5  # w_idx's position among `dsa_attend`'s arguments


def pattern(q, k, v, q_idx, k_idx, w_idx, c: float, topk: int = 2):
    return fs.dsa_attend(q, k, v, q_idx, k_idx, w_idx * c, topk, q_idx.shape[-1] ** -0.5, "reference")


def replacement(q, k, v, q_idx, k_idx, w_idx, c: float, topk: int = 2):
    return fs.dsa_attend(q, k, v, q_idx, k_idx, w_idx, topk, q_idx.shape[-1] ** -0.5, "reference", w_scale=c)


def match(ctx: Ctx, node: Node) -> Match | None:
    if not is_call(node, fs.dsa_attend) or len(node.args) <= W_ARG or "w_scale" in node.kwargs:
        return None
    mul = node.args[W_ARG]
    if not (is_mul(mul) and only_user(mul, node)):
        return None
    w, c = mul.args
    if isinstance(w, int | float) and not isinstance(w, bool):
        w, c = c, w
    if not (isinstance(w, Node) and isinstance(c, int | float)) or isinstance(c, bool):
        return None
    return {"core": node, "mul": mul, "w": w, "c": float(c)}


def rewrite(ctx: Ctx, m: Match) -> None:
    core = m["core"]
    args = list(core.args)
    args[W_ARG] = m["w"]
    core.args = tuple(args)
    core.kwargs = {**core.kwargs, "w_scale": m["c"]}
    ctx.erase(m["mul"])


RULE = Rule("dsa_w_scale", ALGEBRA, pattern, replacement, match, rewrite)
