"""Rule `gdn_block` (opt-in, after `gdn_decode`): a GDN block's decode chain from its in-projection
to its MLP's down projection → one node whose one-token step is one persistent launch
(`kernels.block.gdn_block_decode`) instead of nine.

    q, k, v, a, b, z = linear_split(xn, W_in); o = gdn_step_linear(q, k, v, a, b, z, …, W_o)
    n2, h2 = add_rmsnorm(res, o, γ₂); g, u = linear_split(n2, W_gu); y = down_proj(swiglu(g, u))
        ->   h2, y = gdn_block_step(xn, res, W_in, …, W_o, γ₂, W_gu, W_down)

The block's last residual add and the next block's norm (`add_rmsnorm(h2, y, …)`) stay. In a
one-token step through a cache entry with an fp32 state (`gdn_step_linear`'s conditions), M ≤ 16
rows of one 16-bit dtype, on the Triton path without autograd, the node launches the block kernel;
everything else (prefill, training, the reference backend, float64) runs the nodes it replaced, in
their order.

The match, from a `gdn_step_linear` node: its six inputs are the outputs 0-5 of one bias-free
`linear_split` read by it alone; it is read by one `add_rmsnorm` alone, whose normed output is read
by one bias-free two-part `linear_split` of equal halves alone, whose parts feed one `swiglu` alone,
which one bias-free `nn.Linear` (the down projection) reads alone.

Off by default: on the H100 the block kernel takes 121.0 µs for the hybrid's block at B=1 where
today's kernels take 79.4 (s34, `bench/decode_stream.py`: its products stream at 0.9–1.2 TB/s).
`lt2dsl.compile(..., opt_in=("gdn_block",))` (naming it runs `gdn_decode` too).
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.block import MAX_M, gdn_block_decode, gdn_block_decode_ref
from lt2dsl.lowering.leaf import leaf

from .gdn_step import _step_applies, gdn_step_linear
from .manager import Ctx, Match, Rule, is_call, only_user

ALGEBRA = (
    "split(W_in xn) → gdn_step_linear → add_rmsnorm → split(W_gu) → swiglu → W_down  ->  one block launch"
)
_ORDER = "qkvabz"  # the in-projection's parts as gdn_step_linear reads them


def pattern(*args, **kw):
    """The unfused chain, `gdn_block_decode_ref(xn, res, W_in, offsets, …)`: (h2, y)."""
    return gdn_block_decode_ref(*args, **kw)


def replacement(*args, **kw):
    return gdn_block_decode(*args, **kw)


@leaf
def gdn_block_step(
    xn, res, w_in, wq, wk, wv, bq, bk, bv, A_log, dt_bias, gamma_o, w_o, entry, cu_seqlens, gamma2, w_gu,
    w_down, *, in_sizes: tuple[int, ...], mlp_sizes: tuple[int, int], step: dict, eps2: float,
    add_backend: str, swiglu_backend: str,
):  # fmt: skip
    """(h2, y) of the module docstring's chain; `step` holds `gdn_step_linear`'s keyword arguments.
    One launch for a one-token step the block kernel takes, the replaced nodes otherwise."""
    H, HV, K, V = step["dims"]
    if _block_applies(xn, res, w_in, w_o, w_gu, w_down, mlp_sizes, entry, cu_seqlens, step, (wq, wk, wv)):
        offs = dict(zip(_ORDER, (sum(in_sizes[:i]) for i in range(6))))
        B, D = xn.shape[0], xn.shape[-1]
        core = step["core"]
        h2, y = gdn_block_decode(
            xn.reshape(B, D), res.reshape(B, D), w_in, tuple(offs[p] for p in "qkvzab"), (wq, wk, wv),
            (bq, bk, bv), tuple(entry[k] for k in step["keys"]), A_log, dt_bias, entry["state"], gamma_o, w_o,
            gamma2, w_gu, w_down, heads=H, scale=core["scale"], beta_scale=core["beta_scale"],
            eps_o=step["eps"], eps2=eps2,
        )  # fmt: skip
        return h2.view(res.shape), y.view(res.shape)
    parts = fused.linear_split(xn, w_in, None, in_sizes)
    o = gdn_step_linear(
        *parts, wq, wk, wv, bq, bk, bv, A_log, dt_bias, gamma_o, w_o, entry, cu_seqlens, **step
    )
    n2, h2 = fused.add_rmsnorm(res, o, gamma2, eps2, backend=add_backend)
    g, u = fused.linear_split(n2, w_gu, None, mlp_sizes)
    return h2, F.linear(fused.swiglu(g, u, backend=swiglu_backend), w_down)


def _block_applies(
    xn, res, w_in, w_o, w_gu, w_down, mlp_sizes, entry, cu_seqlens, step: dict, conv_ws
) -> bool:
    """`gdn_step_linear`'s one-token step conditions, and the block kernel's: M ≤ 16 rows of one
    16-bit dtype, weights of that dtype with unit last strides, γ's of that dtype."""
    H, HV, K, V = step["dims"]
    if xn.dim() != 3 or xn.shape[1] != 1 or not 1 <= xn.shape[0] <= MAX_M or res.shape != xn.shape:
        return False
    if xn.dtype not in (torch.bfloat16, torch.float16) or torch.is_grad_enabled():
        return False
    if any(w.dtype != xn.dtype or w.stride(-1) != 1 for w in (w_in, w_o, w_gu, w_down)):
        return False
    F_ = w_down.shape[1]
    if tuple(mlp_sizes) != (F_, F_) or w_gu.shape[0] < 2 * F_ or w_o.shape != (xn.shape[-1], HV * V):
        return False
    # the step's own conditions, on stand-ins of its inputs (xq, then xk, xv, a, b, z)
    B = xn.shape[0]
    xq, xv, ab = (xn.new_empty(B, 1, n) for n in (H * K, HV * V, HV))
    others = (xq, xv, ab, ab, xv)
    return _step_applies(xq, others, entry, step["keys"], cu_seqlens, step["core"], HV, K, V) and all(
        w.device == xn.device for w in conv_ws
    )


# ---- the graph rule ----------------------------------------------------------------------------


def _getitems(node: Node) -> dict[int, Node] | None:
    gets = {u.args[1]: u for u in node.users if is_call(u, operator.getitem)}
    return gets if len(gets) == len(node.users) else None


def _split_of(parts: tuple, n: int) -> Node | None:
    """The `linear_split` whose outputs 0 … n−1 are `parts` in order, each read once, none other."""
    if len(parts) != n or not all(
        is_call(p, operator.getitem) and p.args[1] == i for i, p in enumerate(parts)
    ):
        return None
    split = parts[0].args[0]
    if not is_call(split, fused.linear_split) or len(split.args) != 4 or split.args[2] is not None:
        return None
    gets = _getitems(split)
    if gets is None or set(gets) != set(range(n)) or any(gets[i] is not parts[i] for i in range(n)):
        return None
    return split if not split.kwargs and len(split.args[3]) == n else None


def match(ctx: Ctx, node: Node) -> Match | None:
    if not is_call(node, gdn_step_linear) or len(node.args) != 18:
        return None
    split_in = _split_of(node.args[:6], 6)
    if split_in is None or not all(only_user(p, node) for p in node.args[:6]):
        return None
    add = next(iter(node.users), None)
    if not only_user(node, add) or not is_call(add, fused.add_rmsnorm) or len(add.args) != 4:
        return None
    if add.args[1] is not node or set(add.kwargs) - {"backend"}:
        return None
    gets = _getitems(add)
    if gets is None or set(gets) != {0, 1}:
        return None
    split_mlp = next(iter(gets[0].users), None)
    if not only_user(gets[0], split_mlp) or not is_call(split_mlp, fused.linear_split):
        return None
    parts = _getitems(split_mlp)
    if parts is None or set(parts) != {0, 1} or _split_of((parts[0], parts[1]), 2) is not split_mlp:
        return None
    sizes = tuple(split_mlp.args[3])
    act = next(iter(parts[0].users), None)
    if sizes[0] != sizes[1] or not is_call(act, fused.swiglu) or act.args != (parts[0], parts[1]):
        return None
    if not (only_user(parts[0], act) and only_user(parts[1], act)) or set(act.kwargs) - {"backend"}:
        return None
    down = next(iter(act.users), None)
    lin = ctx.module(down, nn.Linear)
    if not only_user(act, down) or lin is None or lin.bias is not None or len(down.args) != 1 or down.kwargs:
        return None
    return {"step": node, "split_in": split_in, "add": add, "gets": gets, "split_mlp": split_mlp,
            "parts": parts, "act": act, "down": down}  # fmt: skip


def rewrite(ctx: Ctx, m: Match) -> None:
    step, split_in, add, act, down = m["step"], m["split_in"], m["add"], m["act"], m["down"]
    xn, w_in, _, in_sizes = split_in.args
    res, _, gamma2, eps2 = add.args
    kw = {"in_sizes": tuple(in_sizes), "mlp_sizes": tuple(m["split_mlp"].args[3]), "step": dict(step.kwargs),
          "eps2": eps2, "add_backend": add.kwargs.get("backend", ctx.backend),
          "swiglu_backend": act.kwargs.get("backend", ctx.backend)}  # fmt: skip
    # before the add: every input is defined there, and h2's readers may precede the down projection
    with ctx.graph.inserting_before(add):
        w_down = ctx.param(f"{down.target}.weight")
        args = (xn, res, w_in, *step.args[6:18], gamma2, m["split_mlp"].args[1], w_down)
        new = ctx.graph.call_function(gdn_block_step, args, kw)
        h2, y = (ctx.graph.call_function(operator.getitem, (new, i)) for i in range(2))
    m["gets"][1].replace_all_uses_with(h2)
    down.replace_all_uses_with(y)
    ctx.erase(down, act, *m["parts"].values(), m["split_mlp"], m["gets"][0], m["gets"][1], add, step,
              *step.args[:6], split_in)  # fmt: skip


RULE = Rule("gdn_block", ALGEBRA, pattern, replacement, match, rewrite, needs=("gdn_decode",))
