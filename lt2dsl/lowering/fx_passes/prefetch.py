"""Rule `l2_prefetch` (opt-in): after each projection, the next projection's weight is brought into
L2 on a side stream, so the small kernels between two projections overlap the next one's reads.

    y_j = proj_j(x_j); ...; y_{j+1} = proj_{j+1}(x_{j+1})
        ->   y_j = proj_j(x_j); prefetch_after(y_j, W_{j+1}); ...; y_{j+1} = proj_{j+1}(x_{j+1})
    (the last projection prefetches the first's weight: the next step's; `prefetch_join()` last)

At decode a projection reads its whole weight for a handful of rows (bound by HBM), and between two
projections run the small latency-bound kernels (norms, the short conv, the recurrence, attention
over the cache) with HBM nearly idle. `prefetch_after(anchor, *weights)` makes a side stream wait
for the work queued so far (through projection j) and launches `kernels.prefetch.l2_prefetch` of
the next projection's weights there (the first `MAX_BYTES` of them); the main stream goes on
without waiting. `prefetch_join()`, before the output, makes the main stream wait for the side
stream, which a CUDA graph capture needs (every forked stream joined) and which costs nothing
(the prefetch kernels only issue requests). Results are unchanged: a prefetch writes nothing.

A projection is a `linear_split` (the concatenated in-projection, an MLP's gate/up), an
`nn.Linear` call, `F.linear` (the tied LM head), `gated_rmsnorm_linear` (GDN's o_proj) or the
opt-in `proj_add_norm_split` (two weights). It applies on CUDA to decode-sized products (at most
`MAX_ROWS` rows) with no autograd to record; prefill, training and the CPU run the graph as if
the rule had not fired.

Off by default until measured: `lt2dsl bench decode --rules default,+l2_prefetch` (BENCHMARKS.md,
"Written, not yet run on a GPU"), `lt2dsl.compile(..., opt_in=("l2_prefetch",))`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.node import Node, has_side_effect

from lt2dsl.kernels import fused
from lt2dsl.kernels.prefetch import l2_prefetch, prefetch_bytes

from .decode_gemv import proj_add_norm_split
from .manager import Ctx, Match, Rule, is_call

ALGEBRA = "proj_j(x); ...; proj_{j+1}(x') -> proj_j(x); prefetch_L2(W_{j+1}) on a side stream; ..."
# Bytes asked for per projection: about half the H100's 50 MB L2, so a weight's prefetch leaves
# room for what the kernels between the projections touch and does not evict its own first lines.
# A starting point to tune on the card (`bench/l2_prefetch.py --max-mb`), not a measured optimum.
MAX_BYTES = 24 << 20
MAX_ROWS = 16  # a decode step's products (the GEMV kernel's M)

_SIDE: dict[int, torch.cuda.Stream] = {}  # device index -> the prefetch stream
_FORKED: set[int] = set()  # devices whose prefetch stream has work the main stream has not joined


def _side(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE:
        _SIDE[index] = torch.cuda.Stream(device=index)
    return _SIDE[index]


def _first_tensor(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((t for t in map(_first_tensor, value) if t is not None), None)
    return None


def applies(anchor) -> bool:
    """A decode-sized CUDA product with no autograd to record, outside `torch.compile`."""
    t = _first_tensor(anchor)
    if t is None or not t.is_cuda or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    return t.dim() > 0 and t.numel() // max(t.shape[-1], 1) <= MAX_ROWS


@has_side_effect
def prefetch_after(anchor, *weights: torch.Tensor, max_bytes: int = MAX_BYTES) -> None:
    """Once the work queued on the current stream (through the product `anchor`) is done, prefetch
    the first `max_bytes` of `weights` (in order) into L2 on the side stream; the current stream
    does not wait. Nothing happens where `applies(anchor)` is false."""
    if not applies(anchor):
        return
    t = _first_tensor(anchor)
    side = _side(t.device)
    side.wait_stream(torch.cuda.current_stream(t.device))
    with torch.cuda.stream(side):
        for w, nbytes in budget(weights, max_bytes):
            l2_prefetch(w, nbytes)
    _FORKED.add(side.device.index)


def budget(weights, max_bytes: int) -> list[tuple[torch.Tensor, int]]:
    """(weight, bytes to ask for) in order until `max_bytes` are spent: each weight's prefix that
    `kernels.prefetch.prefetch_bytes` allows (a weight it refuses takes nothing)."""
    out, left = [], max_bytes
    for w in weights:
        n = prefetch_bytes(w, left)
        if n:
            out.append((w, n))
            left -= n
    return out


@has_side_effect
def prefetch_join() -> None:
    """The current stream waits for every prefetch stream forked since the last join."""
    for index in sorted(_FORKED):
        torch.cuda.current_stream(index).wait_stream(_SIDE[index])
    _FORKED.clear()


def pattern(x, w, x_next, w_next):
    return F.linear(x, w), F.linear(x_next, w_next)


def replacement(x, w, x_next, w_next):
    y = F.linear(x, w)
    prefetch_after(y, w_next)
    out = (y, F.linear(x_next, w_next))
    prefetch_join()
    return out


# ---- the graph rule ----------------------------------------------------------------------------


def weights(ctx: Ctx, node: Node) -> list[Node | str] | None:
    """The weight operands (nodes, or parameter targets of `nn.Linear` calls) of a projection node,
    in the order it reads them; None for any other node."""
    if is_call(node, fused.linear_split, F.linear, torch._C._nn.linear) and len(node.args) >= 2:
        return [node.args[1]]
    if is_call(node, fused.gated_rmsnorm_linear) and len(node.args) >= 4:
        return [node.args[3]]
    if is_call(node, proj_add_norm_split):
        return [node.args[3], node.args[7]]
    if ctx.module(node, nn.Linear) is not None:
        return [f"{node.target}.weight"]
    return None


def _next_projection(ctx: Ctx, node: Node) -> Node | None:
    n = node.next
    while n.op != "root":
        if weights(ctx, n) is not None:
            return n
        n = n.next
    return None


def match(ctx: Ctx, node: Node) -> Match | None:
    if weights(ctx, node) is None or any(is_call(u, prefetch_after) for u in node.users):
        return None
    after = _next_projection(ctx, node)
    first = after is None
    if first:  # the last projection: the next step starts with the first one
        after = next(n for n in ctx.graph.nodes if weights(ctx, n) is not None)
    return {"node": node, "weights": weights(ctx, after), "wrap": first}


def _target(w: Node | str) -> str:
    return w.target if isinstance(w, Node) else w


def rewrite(ctx: Ctx, m: Match) -> None:
    node = m["node"]
    with ctx.graph.inserting_after(node):
        call = ctx.graph.call_function(prefetch_after, (node,))
    with ctx.graph.inserting_before(call):
        # a parameter is read anew here: the projection's own `get_attr` may come after this point
        ws = [w if isinstance(w, Node) and w.op != "get_attr" else ctx.param(_target(w))
              for w in m["weights"]]  # fmt: skip
    call.args = (node, *ws)
    out = next(n for n in reversed(ctx.graph.nodes) if n.op == "output")
    if not is_call(out.prev, prefetch_join):
        with ctx.graph.inserting_before(out):
            ctx.graph.call_function(prefetch_join, ())


RULE = Rule("l2_prefetch", ALGEBRA, pattern, replacement, match, rewrite)
