"""Rule `gated_norm_proj`: a mixer's gated output RMSNorm and its output projection → one op.

    y = GatedRMSNorm(o, g); out = W_o flatten(y)   ->   out = gated_rmsnorm_linear(o, g, γ, W_o)

(mixers.md §0 GatedRMSNorm_fla: RMSNorm(o) ⊙ act(g) per head; Mamba2's RMSNorm(o ⊙ SiLU(z)) per
group.) The unfused module runs a dozen elementwise kernels in fp32 over `[B, T, HV·V]` plus their
backward; the fused op runs one norm kernel and the GEMM, and recomputes the normed activations in
the backward rather than keeping them. The normed output (and the flatten view) must be read by
the projection alone.
"""

from __future__ import annotations

from torch import nn
from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.lowering.functional_recurrent import GatedRMSNorm

from .manager import Ctx, Match, Rule, is_method, only_user

ALGEBRA = "W_o flatten(rmsnorm(o) * act(g)) -> gated_rmsnorm_linear(o, g, W_o)"


# The pair is the reference and the fused op themselves: same arguments (the fused op also takes
# `backend`), eps, act, group, norm_before_gate and n_flat by keyword.
pattern = naive.gated_rmsnorm_linear_ref
replacement = fused.gated_rmsnorm_linear


def _flat_view(node) -> bool:
    """`y.flatten(-2)` (the heads merged for the projection)."""
    return is_method(node, "flatten") and tuple(node.args[1:]) in ((-2,), (-2, -1)) and not node.kwargs


def match(ctx: Ctx, node: Node) -> Match | None:
    norm = ctx.module(node, GatedRMSNorm)
    if norm is None or not 1 <= len(node.args) <= 2 or node.kwargs or len(node.users) != 1:
        return None
    nxt, n_flat, nodes = next(iter(node.users)), 1, [node]
    if _flat_view(nxt):
        if not only_user(node, nxt) or len(nxt.users) != 1:
            return None
        nodes.append(nxt)
        nxt, n_flat = next(iter(nxt.users)), 2
    proj = ctx.module(nxt, nn.Linear)
    if proj is None or nxt.args != (nodes[-1],) or nxt.kwargs:
        return None
    gate = node.args[1] if len(node.args) == 2 and norm.act is not None else None
    return {
        "norm": norm,
        "norm_node": node,
        "proj": proj,
        "proj_node": nxt,
        "o": node.args[0],
        "gate": gate,
        "n_flat": n_flat,
        "nodes": [nxt, *reversed(nodes)],
    }


def rewrite(ctx: Ctx, m: Match) -> None:
    norm, proj_node = m["norm"], m["proj_node"]
    kw = {
        "eps": norm.eps,
        "act": norm.act,
        "group": norm.group,
        "norm_before_gate": norm.norm_before_gate,
        "n_flat": m["n_flat"],
        "backend": ctx.backend,
    }
    with ctx.graph.inserting_before(proj_node):
        nw = ctx.param(f"{m['norm_node'].target}.weight")
        pw = ctx.param(f"{proj_node.target}.weight")
        pb = ctx.param(f"{proj_node.target}.bias") if m["proj"].bias is not None else None
        out = ctx.graph.call_function(fused.gated_rmsnorm_linear, (m["o"], m["gate"], nw, pw, pb), kw)
    proj_node.replace_all_uses_with(out)
    ctx.erase(*m["nodes"])


RULE = Rule("gated_norm_proj", ALGEBRA, pattern, replacement, match, rewrite)
