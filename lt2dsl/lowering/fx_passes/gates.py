"""Rules `gdn_gate` and `gdn_gate_core`: the GDN gate activations → one kernel feeding the core op,
then that kernel and the core → one node.

    g = −exp(A_log) · softplus(a + dt_bias);  β = σ(b) [· 2]   ->   g, β = gdn_gate(a, b, A_log, dt_bias)

(mixers.md §5(a), fp32.) The unfused graph spends about ten nodes on this (four casts, exp, neg,
add, softplus, mul, sigmoid, and the ×2 of `neg_eigval`), each a kernel over `[B, T, HV]`, forward
and backward. Every intermediate must be read by the chain alone. The core op is unchanged: the
gates still make one `[B, T, HV]` round trip through memory, which a delta-rule kernel prologue
taking raw a, b would save: `gdn_gate_core` is that prologue. It joins a GDN core (with or
without its own q/k L2Norm) and the `gdn_gate` node feeding it, read by the core alone, into
`leaves.gated_delta_rule_core_gates`, whose decode step forms g and β inside the recurrent kernel
(`kernels.delta.gates`): one launch a step instead of two, and no `[B, T, HV]` round trip.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.delta.gates import gdn_decode_gates, gdn_decode_gates_ref
from lt2dsl.kernels.fused import naive
from lt2dsl.lowering import functional_recurrent as fr

from .leaves import gated_delta_rule_core_gates, gated_delta_rule_core_normed
from .manager import Ctx, Match, Rule, cast_dtype, is_add, is_call, is_method, is_mul, only_user

ALGEBRA = "-exp(A_log) * softplus(a + dt_bias), sigmoid(b) [* 2] -> gdn_gate(a, b, A_log, dt_bias)"


def pattern(a, b, A_log, dt_bias, beta_scale: float = 1.0, dtype: torch.dtype = torch.float32):
    return naive.gdn_gate_ref(a, b, A_log, dt_bias, beta_scale, dtype)


def replacement(
    a, b, A_log, dt_bias, beta_scale: float = 1.0, dtype: torch.dtype = torch.float32, backend: str = "auto"
):
    return fused.gdn_gate(a, b, A_log, dt_bias, beta_scale=beta_scale, dtype=dtype, backend=backend)


def _param_cast(node, user: Node) -> tuple[Node, torch.dtype] | None:
    """`p.to(dtype)` of a parameter (`get_attr`), read by `user` alone → (p, dtype)."""
    dt = cast_dtype(node)
    if dt is None or not only_user(node, user) or node.args[0].op != "get_attr":
        return None
    return node.args[0], dt


def _decay(g) -> Match | None:
    """g = neg(exp(A_log.to(dt))) * softplus(a.to(dt) + dt_bias.to(dt))."""
    if not is_mul(g):
        return None
    neg, sp = g.args
    if is_call(sp, operator.neg):
        neg, sp = sp, neg
    if not (is_call(neg, operator.neg, torch.neg) and only_user(neg, g)):
        return None
    if not (
        is_call(sp, F.softplus, torch._C._nn.softplus)
        and len(sp.args) == 1
        and not sp.kwargs
        and only_user(sp, g)
    ):
        return None
    exp, add = neg.args[0], sp.args[0]
    if not (
        is_method(exp, "exp")
        and len(exp.args) == 1
        and only_user(exp, neg)
        and is_add(add)
        and only_user(add, sp)
    ):
        return None
    A = _param_cast(exp.args[0], exp)
    a_cast, dt_cast = add.args
    a_dt, dt = cast_dtype(a_cast), _param_cast(dt_cast, add)
    if A is None or dt is None or a_dt is None or not only_user(a_cast, add) or not A[1] == dt[1] == a_dt:
        return None
    nodes = [g, sp, add, a_cast, dt_cast, neg, exp, exp.args[0]]
    return {"a": a_cast.args[0], "A_log": A[0], "dt_bias": dt[0], "dtype": a_dt, "nodes": nodes}


def _beta(beta) -> Match | None:
    """β = sigmoid(b.to(dt)), optionally times a constant (`neg_eigval`: 2)."""
    scale, nodes = 1.0, []
    if is_mul(beta) and isinstance(beta.args[1], float | int):
        scale, nodes, beta = float(beta.args[1]), [beta], beta.args[0]
        if not only_user(beta, nodes[0]):
            return None
    if not (is_call(beta, torch.sigmoid) and len(beta.args) == 1 and not beta.kwargs):
        return None
    cast = beta.args[0]
    dt = cast_dtype(cast)
    if dt is None or not only_user(cast, beta):
        return None
    return {"b": cast.args[0], "beta_scale": scale, "dtype": dt, "nodes": [*nodes, beta, cast]}


def match(ctx: Ctx, node: Node) -> Match | None:
    if not is_call(node, fr.gated_delta_rule_core) or len(node.args) < 5:
        return None
    g, beta = node.args[3], node.args[4]
    if not (only_user(g, node) and only_user(beta, node)):
        return None
    dm, bm = _decay(g), _beta(beta)
    if dm is None or bm is None or dm["dtype"] != bm["dtype"]:
        return None
    return {"core": node, **dm, **bm, "nodes": dm["nodes"] + bm["nodes"]}


def rewrite(ctx: Ctx, m: Match) -> None:
    core = m["core"]
    backend = core.kwargs.get("backend", ctx.backend)
    kw = {"beta_scale": m["beta_scale"], "dtype": m["dtype"], "backend": backend}
    with ctx.graph.inserting_before(core):
        gates = ctx.graph.call_function(fused.gdn_gate, (m["a"], m["b"], m["A_log"], m["dt_bias"]), kw)
        g = ctx.graph.call_function(operator.getitem, (gates, 0))
        beta = ctx.graph.call_function(operator.getitem, (gates, 1))
    core.args = (*core.args[:3], g, beta, *core.args[5:])
    # A_log and dt_bias (get_attr) stay: the fused call reads them; a loop reuses them
    ctx.erase(*(n for n in m["nodes"] if n.op != "get_attr"))


RULE = Rule("gdn_gate", ALGEBRA, pattern, replacement, match, rewrite)


ALGEBRA_CORE = "core(q, k, v, *gdn_gate(a, b, A_log, dt_bias), entry) -> core_gates(q, k, v, a, b, …, entry)"
# the GDN cores a `gdn_gate` node feeds → whether the core L2-normalises q and k itself
CORES = {fr.gated_delta_rule_core: True, gated_delta_rule_core_normed: False}


def pattern_core(q, k, v, a, b, A_log, dt_bias, state, beta_scale: float = 1.0):
    """(o, final state) of the gates, then the recurrence from a copy of `state`."""
    s = state.clone()
    return gdn_decode_gates_ref(q, k, v, a, b, A_log, dt_bias, s, beta_scale=beta_scale), s


def replacement_core(q, k, v, a, b, A_log, dt_bias, state, beta_scale: float = 1.0, backend: str = "auto"):
    s = state.clone()
    return gdn_decode_gates(q, k, v, a, b, A_log, dt_bias, s, beta_scale=beta_scale, backend=backend), s


def match_core(ctx: Ctx, node: Node) -> Match | None:
    if not (node.op == "call_function" and node.target in CORES and len(node.args) == 6):
        return None
    g, beta = node.args[3], node.args[4]
    if not (is_call(g, operator.getitem) and is_call(beta, operator.getitem)):
        return None
    gates = g.args[0]
    if not (is_call(gates, fused.gdn_gate) and beta.args[0] is gates and (g.args[1], beta.args[1]) == (0, 1)):
        return None
    if set(gates.users) != {g, beta} or not (only_user(g, node) and only_user(beta, node)):
        return None
    return {"core": node, "gates": gates, "g": g, "beta": beta}


def rewrite_core(ctx: Ctx, m: Match) -> None:
    core, gates = m["core"], m["gates"]
    kw = {
        "beta_scale": gates.kwargs.get("beta_scale", 1.0),
        "gate_dtype": gates.kwargs.get("dtype", torch.float32),
        "gate_backend": gates.kwargs.get("backend", ctx.backend),
        "l2norm": CORES[core.target],
        **core.kwargs,
    }
    q, k, v, _, _, entry = core.args
    with ctx.graph.inserting_before(core):
        new = ctx.graph.call_function(gated_delta_rule_core_gates, (q, k, v, *gates.args, entry), kw)
    core.replace_all_uses_with(new)
    ctx.erase(core, m["g"], m["beta"], gates)


RULE_CORE = Rule(
    "gdn_gate_core",
    ALGEBRA_CORE,
    pattern_core,
    replacement_core,
    match_core,
    rewrite_core,
    needs=("gdn_gate",),
)
