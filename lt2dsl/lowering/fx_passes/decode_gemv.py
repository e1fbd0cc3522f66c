"""Rule `decode_gemv` (opt-in): a projection, the residual add-norm after it and the projections of
the normed sum → one node that a static-cache decode step runs as two GEMV launches.

    r = proj(x); n, s = add_rmsnorm(res, r, γ, ε); parts = linear_split(n, W_cat) [; h = swiglu(parts)]
        ->   s, *parts (or s, h) = proj_add_norm_split(x, ..., res, None, γ, W_cat, pos)
    r = proj(x); n, s = norm_add_rmsnorm(res, r, γ₁, ε₁, γ, ε); ...  (a sandwich block's)
        ->   s, *parts (or s, h) = proj_add_norm_split(x, ..., res, γ₁, γ, W_cat, pos, branch_eps=ε₁)

`proj` is an `nn.Linear` without bias (DSA's o_proj, the MLP's down_proj) or a mixer's
`gated_rmsnorm_linear` (GDN's o_proj). In the engine's decode step (positions per row, M ≤ 16
rows, the Triton path, no autograd) the node launches `gemv(x, W_proj, residual=res)` (the add in
the epilogue; GDN's gated RMSNorm, fla's form, in the prologue) and `gemv(s, W_cat, rmsnorm γ)`
(the norm in the prologue, a SwiGLU in the epilogue when the split feeds one), so the add-norm,
SwiGLU and gated-norm kernels go: a GDN application runs in-proj · conv · recurrence · o_proj ·
gate/up · down, a DSA one drops two launches likewise. Everything else (prefill, a dynamic cache,
training) runs the nodes it replaced, in their order (`proj_add_norm_split`'s fallback).

In a sandwich block the branch's RMSNorm · γ₁ spans the whole projection output, so it cannot be
the first GEMV's epilogue: that one launches `gemv(x, W_proj)` and the second `norm_add_gemv` (the
norm-add-norm in its prologue, which also writes s), two launches for the projection, the
norm-add-norm and the next projection.

The match, from a `fused.add_rmsnorm` or `fused.norm_add_rmsnorm` node: its branch input is the
projection, read by the add alone; both outputs are read, the normed one by one bias-free
`linear_split` alone; a split of two equal parts each read only by one `swiglu(g, u)` joins it.
The graph's `cache_pos` node gives the leaf the step's positions.

Off by default: on the H100 the hybrid's whole decode step is 2-3% slower with it than with cuBLAS
and the unfused kernels (s32; 4-6% in s26). `fuse(gm, opt_in=["decode_gemv"])`,
`lt2dsl.compile(..., opt_in=("decode_gemv",))` or `lt2dsl bench decode --rules +decode_gemv` turn it on.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.gemv import gemv, gemv_applies, groups_fit, norm_add_gemv
from lt2dsl.lowering import functional as lf
from lt2dsl.lowering.cache import RowPositions
from lt2dsl.lowering.leaf import leaf

from .manager import Ctx, Match, Rule, is_call, only_user

ALGEBRA = (
    "split(rmsnorm(res + [rmsnorm₁] W x) W_cat) -> gemv(rmsnorm; gemv(x, W) + res, W_cat) [; swiglu epilogue]"
)
_GATED_KW = ("eps", "act", "group", "norm_before_gate", "n_flat")


def pattern(x, w, res, gamma, eps: float, w_cat, sizes):
    """(s, *parts) of the unfused nodes."""
    n, s = fused.add_rmsnorm(res, F.linear(x, w), gamma, eps, backend="reference")
    return (s, *fused.linear_split(n, w_cat, None, sizes))


def replacement(x, w, res, gamma, eps: float, w_cat, sizes, backend: str = "auto"):
    s = gemv(x, w, residual=res, backend=backend)
    y = gemv(s, w_cat, norm_weight=gamma, eps=eps, backend=backend)
    pad = w_cat.shape[0] - sum(sizes)
    return (s, *y.split([*sizes, pad] if pad else list(sizes), dim=-1)[: len(sizes)])


@leaf
def proj_add_norm_split(
    x, gate, o_norm_weight, proj_weight, res, branch_weight, norm_weight, cat_weight, pos, *,
    eps: float | None, sizes: tuple[int, ...], gated: dict | None, swiglu: bool, backend: str,
    branch_eps: float | None = None,
):  # fmt: skip
    """(s, *parts), or (s, h) with `swiglu`: s = res + proj(x) (with `branch_weight` γ₁: res +
    RMSNorm(proj(x)) · γ₁, ε `branch_eps`), parts = linear_split(RMSNorm(s) · γ, W_cat),
    h = silu(parts[0]) · parts[1].

    x `[B, T, K]` (with `gated`: the core output o `[B, T, H, V]`, `gate` of its shape, normed by
    `GatedRMSNorm(o_norm_weight, **gated)` first); proj_weight `[D, K]`; res `[B, T, D]`; cat_weight
    `[Σ sizes + pad, D]`. A static cache's decode step (`pos` a `RowPositions`) runs two GEMV
    launches; anything else the unfused nodes."""
    branch = None if branch_weight is None else (branch_weight, branch_eps)
    if not _gemv_step(x, gate, o_norm_weight, proj_weight, res, cat_weight, pos, gated, backend):
        return _unfused(x, gate, o_norm_weight, proj_weight, res, branch, norm_weight, cat_weight, eps, sizes,
                        gated, swiglu, backend)  # fmt: skip
    glu = {"up": sizes[0], "width": sizes[1]} if swiglu else {}
    if branch is not None:
        r = _proj_gemv(x, gate, o_norm_weight, proj_weight, res.shape[:-1], None, gated, backend)
        s, y = norm_add_gemv(res, r, *branch, cat_weight, norm_weight, eps, **glu, backend=backend)
    else:
        s = _proj_gemv(x, gate, o_norm_weight, proj_weight, res.shape[:-1], res, gated, backend)
        y = gemv(s, cat_weight, norm_weight=norm_weight, eps=eps, **glu, backend=backend)
    if swiglu:
        return s, y
    pad = cat_weight.shape[0] - sum(sizes)
    return (s, *y.split([*sizes, pad] if pad else list(sizes), dim=-1)[: len(sizes)])


def _proj_gemv(x, gate, o_norm_weight, proj_weight, rows, res, gated: dict | None, backend: str):
    """proj(x) (+ res) `[*rows, D]`: one GEMV; with `gated`, fla's gated norm (SiLU gate after the
    norm) in its prologue when its groups fit the kernel's K tiles, else the gated norm's own
    kernel before it."""
    if gated is None:
        return gemv(x, proj_weight, residual=res, backend=backend)
    L = proj_weight.shape[1]
    fla = gated["act"] == "silu" and gated["norm_before_gate"]
    if fla and groups_fit(L, o_norm_weight.shape[0], gated["group"]):
        o, z = x.reshape(*rows, L), gate.reshape(*rows, L)
        kw = {"norm_weight": o_norm_weight, "eps": gated["eps"], "gate": z, "group": gated["group"]}
        return gemv(o, proj_weight, residual=res, **kw, backend=backend)
    x = _gated_norm(x, gate, o_norm_weight, L, gated).view(*rows, L)
    return gemv(x, proj_weight, residual=res, backend=backend)


def _unfused(x, gate, o_norm_weight, proj_weight, res, branch, norm_weight, cat_weight, eps, sizes, gated,
             swiglu, backend):  # fmt: skip
    """The replaced nodes, in their order."""
    if gated is None:
        r = F.linear(x, proj_weight)
    else:
        r = fused.gated_rmsnorm_linear(x, gate, o_norm_weight, proj_weight, None, **gated, backend=backend)
    if branch is None:
        n, s = fused.add_rmsnorm(res, r, norm_weight, eps, backend=backend)
    else:
        n, s = fused.norm_add_rmsnorm(res, r, *branch, norm_weight, eps, backend=backend)
    parts = fused.linear_split(n, cat_weight, None, sizes)
    if swiglu:
        return s, fused.swiglu(parts[0], parts[1], backend=backend)
    return (s, *parts)


def _gemv_step(x, gate, o_norm_weight, proj_weight, res, cat_weight, pos, gated, backend: str) -> bool:
    """A static cache's decode step whose two products the GEMV kernel takes (and, with `gated`, the
    gated norm's kernel its input)."""
    if not isinstance(pos, RowPositions) or torch.compiler.is_compiling():
        return False
    if not gemv_applies(res, cat_weight, backend=backend) or res.shape[-1] != proj_weight.shape[0]:
        return False
    if gated is None:
        return gemv_applies(x, proj_weight, res, backend=backend)
    rows = x.shape[: x.dim() - gated["n_flat"]]
    same = proj_weight.dtype == res.dtype and proj_weight.stride(-1) == 1 and rows == res.shape[:-1]
    return same and _gated_norm_applies(x, gate, o_norm_weight, proj_weight, gated)


def _gated_norm_applies(o, gate, norm_weight, proj_weight, gated: dict) -> bool:
    """The gated norm's Triton kernel takes o (`fused.gated_rmsnorm_linear`'s own conditions)."""
    L, dim, n_flat = proj_weight.shape[1], norm_weight.shape[0], gated["n_flat"]
    return (
        o.shape[o.dim() - n_flat :].numel() == L
        and L % dim == 0
        and dim % gated["group"] == 0
        and o.dtype == norm_weight.dtype == proj_weight.dtype
        and (gated["act"] is None or (gate is not None and gate.shape == o.shape))
    )


def _gated_norm(o, gate, norm_weight, L: int, gated: dict) -> torch.Tensor:
    """`GatedRMSNorm(o, gate)` flattened to `[M, L]`, one launch (the kernel of `gated_rmsnorm_linear`)."""
    from lt2dsl.kernels.fused.common import rows_view
    from lt2dsl.kernels.fused.triton_norm import gated_rmsnorm_fwd

    act = gated["act"]
    g2 = rows_view(gate, L) if act is not None and gate is not None else None
    first = gated["norm_before_gate"] or act is None
    return gated_rmsnorm_fwd(rows_view(o, L), g2, norm_weight, float(gated["eps"]), fused.ACT_CODES[act],
                             gated["group"], first)  # fmt: skip


# ---- the graph rule ----------------------------------------------------------------------------


def _proj(ctx: Ctx, r: Node, add: Node) -> dict | None:
    """The projection r = proj(x) read by the add alone: a bias-free `nn.Linear` or a bias-free
    `gated_rmsnorm_linear`."""
    if not only_user(r, add):
        return None
    lin = ctx.module(r, nn.Linear)
    if lin is not None and lin.bias is None and len(r.args) == 1 and not r.kwargs:
        return {"x": r.args[0], "gate": None, "o_norm": None, "weight": f"{r.target}.weight", "gated": None}
    if not is_call(r, fused.gated_rmsnorm_linear) or len(r.args) != 5 or r.args[4] is not None:
        return None
    if set(r.kwargs) != {*_GATED_KW, "backend"}:
        return None
    o, gate, o_norm, w, _ = r.args
    gated = {k: r.kwargs[k] for k in _GATED_KW}
    return {"x": o, "gate": gate, "o_norm": o_norm, "weight": w, "gated": gated}


def _getitems(node: Node) -> dict[int, Node] | None:
    """{index: getitem} when every user of `node` is one distinct `operator.getitem`."""
    gets = {u.args[1]: u for u in node.users if is_call(u, operator.getitem)}
    return gets if len(gets) == len(node.users) else None


def _swiglu(parts: dict[int, Node], sizes) -> Node | None:
    """The one `swiglu(g, u)` of a two-part split of equal halves reading them alone."""
    if len(sizes) != 2 or sizes[0] != sizes[1] or set(parts) != {0, 1}:
        return None
    act = next(iter(parts[0].users), None)
    if not is_call(act, fused.swiglu) or act.args != (parts[0], parts[1]) or set(act.kwargs) - {"backend"}:
        return None
    return act if only_user(parts[0], act) and only_user(parts[1], act) else None


def _positions(ctx: Ctx) -> Node | None:
    return next((n for n in ctx.graph.nodes if is_call(n, lf.cache_pos)), None)


def match(ctx: Ctx, node: Node) -> Match | None:
    sandwich = is_call(node, fused.norm_add_rmsnorm) and len(node.args) == 6
    if not (sandwich or (is_call(node, fused.add_rmsnorm) and len(node.args) == 4)):
        return None
    if set(node.kwargs) - {"backend"}:
        return None
    res, r = node.args[:2]
    gets = _getitems(node)
    if not isinstance(r, Node) or not isinstance(res, Node) or gets is None or set(gets) != {0, 1}:
        return None
    proj = _proj(ctx, r, node)
    split = next(iter(gets[0].users), None)
    if proj is None or not only_user(gets[0], split) or not is_call(split, fused.linear_split):
        return None
    if len(split.args) != 4 or split.args[0] is not gets[0] or split.args[2] is not None or split.kwargs:
        return None
    parts, pos = _getitems(split), _positions(ctx)
    if parts is None or pos is None:
        return None
    sizes = tuple(split.args[3])
    return {"add": node, "r": r, "gets": gets, "split": split, "parts": parts, "proj": proj, "sizes": sizes,
            "swiglu": _swiglu(parts, sizes), "pos": pos, "sandwich": sandwich}  # fmt: skip


def rewrite(ctx: Ctx, m: Match) -> None:
    add, proj, split, act = m["add"], m["proj"], m["split"], m["swiglu"]
    res, _, *norms = add.args
    branch, branch_eps, gamma, eps = norms if m["sandwich"] else (None, None, *norms)
    kw = {"eps": eps, "sizes": m["sizes"], "gated": proj["gated"], "swiglu": act is not None,
          "backend": add.kwargs.get("backend", ctx.backend), "branch_eps": branch_eps}  # fmt: skip
    with ctx.graph.inserting_before(add):
        w = proj["weight"] if isinstance(proj["weight"], Node) else ctx.param(proj["weight"])
        args = (proj["x"], proj["gate"], proj["o_norm"], w, res, branch, gamma, split.args[1], m["pos"])
        new = ctx.graph.call_function(proj_add_norm_split, args, kw)
        n_out = 1 + (1 if act is not None else len(m["sizes"]))
        outs = [ctx.graph.call_function(operator.getitem, (new, i)) for i in range(n_out)]
    m["gets"][1].replace_all_uses_with(outs[0])
    if act is not None:
        act.replace_all_uses_with(outs[1])
        ctx.erase(act)
    else:
        for i, g in m["parts"].items():
            g.replace_all_uses_with(outs[1 + i])
    ctx.erase(*m["parts"].values(), split, m["gets"][0], m["gets"][1], add, m["r"])
    ctx.erase(*[o for o in outs if not o.users])


RULE = Rule("decode_gemv", ALGEBRA, pattern, replacement, match, rewrite)
