"""Rule `rope_cache`: RoPE of q and k, then k (and v) appended to the cache → one node.

    q, k = rope_pair(q, [LayerNorm](k)); append(entry, "k", k); [append(entry, "v", v)]
        ->   q, k_all, v_all = rope_append_cached(q, k, v, entry, ...)

A static cache's decode step writes each appended token with a scatter of its own (`engine.cache`):
two launches per attention layer after the RoPE launch, three per DSA layer (k, v, the index
key) after two, plus the index key's LayerNorm. In the fused node the RoPE kernel writes k and v
straight into their cache slots (`fused.rope_cache`), and takes the LayerNorm of DSA's index key
as its prologue: one launch per rope_pair. Everything else (prefill, a dynamic cache, autograd)
runs the nodes it replaced (`leaves.rope_append_cached`).

The match, from a `rope_pair` node: its k output goes, through `transpose(1, 2)` (cache dim 2) or
`squeeze(2)` (one head, cache dim 1), to one `append_cache`, and nothing else reads it; a v append
is joined when the same entry appends `v.transpose(1, 2)` with the same dim and window, and v is
computed before the `rope_pair`; k may be `unsqueeze(2)` of an affine `nn.LayerNorm` read by it
alone. The fused node takes the `rope_pair`'s place, so every reader of its outputs follows it;
the entry's other readers between it and the appends it replaces may only append other names.
"""

from __future__ import annotations

import operator

from torch import nn
from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.lowering import functional as lf

from .leaves import rope_append_cached
from .manager import Ctx, Match, Rule, is_call, is_method, only_user

ALGEBRA = "rope_pair(q, [LN](k)); append(k); [append(v)] -> rope_append_cached(q, k, v, entry)"
_APPENDS = (lf.append_cache, rope_append_cached)


def pattern(q, k, v, c, s, k_cache, v_cache, positions, norm=None):
    """(q turned, caches) of the unfused math on copies of the caches."""
    kc, vc = k_cache.clone(), v_cache.clone()
    return naive.rope_cache_ref(q, k, v, c, s, kc, vc, positions, False, norm), kc, vc


def replacement(q, k, v, c, s, k_cache, v_cache, positions, norm=None, backend: str = "auto"):
    kc, vc = k_cache.clone(), v_cache.clone()
    return fused.rope_cache(q, k, v, c, s, kc, vc, positions, norm=norm, backend=backend), kc, vc


def _append_args(node: Node) -> tuple | None:
    """(entry, key, new, dim, keep) of an `append_cache` call, else None."""
    if not is_call(node, lf.append_cache):
        return None
    names = ("entry", "key", "new", "dim", "keep")
    bound = dict(zip(names, node.args)) | dict(node.kwargs)
    if not set(bound) <= set(names) or len(bound) < 3:
        return None
    return bound["entry"], bound["key"], bound["new"], bound.get("dim", 2), bound.get("keep")


def _k_append(gk: Node) -> tuple[Node, Node, tuple] | None:
    """k's view (transpose(1, 2) or squeeze(2)) → its one `append_cache` → (view, append, args)."""
    if len(gk.users) != 1:
        return None
    view = next(iter(gk.users))
    want = 2 if is_method(view, "transpose") and tuple(view.args[1:]) == (1, 2) else None
    if is_method(view, "squeeze") and tuple(view.args[1:]) == (2,):
        want = 1
    if want is None or len(view.users) != 1:
        return None
    app = next(iter(view.users))
    args = _append_args(app)
    if args is None or args[2] is not view or args[3] != want or not isinstance(args[1], str):
        return None
    return view, app, args


def _precedes(a: Node, b: Node) -> bool:
    """`a` comes before `b` in the graph."""
    n = a.next
    while n.op != "root":
        if n is b:
            return True
        n = n.next
    return False


def _v_append(rope: Node, entry: Node, dim: int, keep) -> tuple[Node, Node, Node] | None:
    """The same entry's append of `v.transpose(1, 2)` (key "v", same dim and window), v computed
    before the rope → (v, view, append)."""
    for app in entry.users:
        args = _append_args(app)
        if args is None or args[1] != "v" or args[3] != dim or args[4] != keep:
            continue
        view = args[2]
        if is_method(view, "transpose") and tuple(view.args[1:]) == (1, 2) and only_user(view, app):
            v = view.args[0]
            if isinstance(v, Node) and _precedes(v, rope):
                return v, view, app
    return None


def _norm(ctx: Ctx, k: Node, rope: Node) -> tuple[Node, Node, nn.LayerNorm] | None:
    """k = unsqueeze(LayerNorm(x), 2) with an affine LayerNorm over the last dim, read by the rope
    alone → (unsqueeze, norm node, module)."""
    if not (is_method(k, "unsqueeze") and tuple(k.args[1:]) == (2,) and only_user(k, rope)):
        return None
    ln = ctx.module(k.args[0], nn.LayerNorm)
    if ln is None or not only_user(k.args[0], k) or ln.weight is None or ln.bias is None:
        return None
    return k, k.args[0], ln


def _quiet_between(rope: Node, entry: Node, last: Node, ours: set) -> bool:
    """Between the rope and the last replaced append, the entry is read only by appends of other
    names (the moved writes land where nothing reads them)."""
    n = rope.next
    while n is not last:
        if entry in n.all_input_nodes and n not in ours and not is_call(n, *_APPENDS):
            return False
        n = n.next
    return True


def match(ctx: Ctx, node: Node) -> Match | None:
    if not is_call(node, lf.rope_pair) or len(node.args) != 6:
        return None
    gets = {u.args[1]: u for u in node.users if is_call(u, operator.getitem)}
    if len(gets) != 2 or len(node.users) != 2 or set(gets) != {0, 1}:
        return None
    k_side = _k_append(gets[1])
    if k_side is None:
        return None
    k_view, k_app, (entry, key, _, dim, keep) = k_side
    if not isinstance(entry, Node) or not _precedes(entry, node):
        return None
    v_side = _v_append(node, entry, dim, keep) if dim == 2 and key == "k" else None
    if v_side is not None and not _precedes(node, v_side[2]):
        v_side = None
    norm = _norm(ctx, node.args[1], node)
    last = v_side[2] if v_side is not None and _precedes(k_app, v_side[2]) else k_app
    ours = {k_app, k_view, *(v_side[1:] if v_side else ())}
    if not _quiet_between(node, entry, last, ours):
        return None
    return {"rope": node, "gets": gets, "k": k_side, "v": v_side, "norm": norm, "key": key}


def rewrite(ctx: Ctx, m: Match) -> None:
    rope, gets, norm = m["rope"], m["gets"], m["norm"]
    k_view, k_app, (entry, key, _, dim, keep) = m["k"]
    q, k, pos, theta, scaling, cu = rope.args
    v, v_view, v_app = m["v"] if m["v"] is not None else (None, None, None)
    kw = {"dims": rope.kwargs.get("dims"), "backend": rope.kwargs.get("backend", ctx.backend), "dim": dim,
          "keep": keep, "keys": (key, "v") if v is not None else (key,)}  # fmt: skip
    with ctx.graph.inserting_before(rope):
        w = b = None
        if norm is not None:
            unsq, ln_node, ln = norm
            w, b = ctx.param(f"{ln_node.target}.weight"), ctx.param(f"{ln_node.target}.bias")
            kw["norm_eps"] = float(ln.eps)
            k = ctx.graph.call_method("unsqueeze", (ln_node.args[0], 2))
        new = ctx.graph.call_function(rope_append_cached, (q, k, v, entry, pos, theta, scaling, cu, w, b), kw)
        outs = [ctx.graph.call_function(operator.getitem, (new, i)) for i in range(3)]
    gets[0].replace_all_uses_with(outs[0])
    k_app.replace_all_uses_with(outs[1])
    if v_app is not None:
        v_app.replace_all_uses_with(outs[2])
    ctx.erase(k_app, k_view, gets[1], gets[0], rope, *((v_app, v_view) if v_app is not None else ()))
    if norm is not None:
        ctx.erase(norm[0], norm[1])
    if v_app is None:
        ctx.erase(outs[2])


RULE = Rule("rope_cache", ALGEBRA, pattern, replacement, match, rewrite)
