"""Rule `l2_prefetch` (opt-in): after each projection, the weights the next projections read are
brought into L2 on a side stream, so the small kernels between projections overlap their reads.

    y_j = proj_j(x_j); ...   ->   y_j = proj_j(x_j); prefetch_after(y_j, W…, ranges=…); ...
    (`prefetch_join()` before the output)

At decode a projection reads its whole weight for a handful of rows (bound by HBM), and between two
projections run the small latency-bound kernels (norms, the short conv, the recurrence, attention
over the cache) with HBM nearly idle. The rule lays the step's weights out as one byte stream in
the order the projections read them and keeps L2 `MAX_BYTES` ahead of it: once projection j is
done, `prefetch_after` asks for the stream's bytes from where the last request ended (or from the
end of projection j's weights) to `MAX_BYTES` past them, so a long window (a GDN block's conv,
recurrence and gated norm between its in-projection and o_proj) also reaches into the weights
after the next one, and no byte is asked for twice in a step. The last projection (the head) asks
for the first `MAX_BYTES` of the stream: the next step's. A side stream waits for the work queued
so far and launches `kernels.prefetch.l2_prefetch` of each range there; the main stream goes on
without waiting. `prefetch_join()`, before the output, makes the main stream wait for the side
stream, which a CUDA graph capture needs (every forked stream joined) and which costs nothing (the
prefetch kernels only issue requests). Results are unchanged: a prefetch writes nothing.

A projection is a `linear_split` (the concatenated in-projection, an MLP's gate/up), an
`nn.Linear` call, `F.linear` (the tied LM head), `gated_rmsnorm_linear` (GDN's o_proj), or the
opt-in rules' `proj_add_norm_split` (two weights) and `gdn_step_linear` (W_o). It applies on
CUDA to decode-sized products (at most `MAX_ROWS` rows) with no autograd to record; prefill,
training and the CPU run the graph as if the rule had not fired. Where a weight's size is not
known from the graph, each projection asks for the next one's weights, `MAX_BYTES` of each.

Off by default: on the H100 the hybrid's step is 11% slower at B=1 and 6% at B=8 with it (s32,
docs/decode.md); one projection after 4-8 small kernels gains 1-5% (`bench/l2_prefetch.py`).
`lt2dsl bench decode --rules default,+l2_prefetch`, `lt2dsl.compile(..., opt_in=("l2_prefetch",))`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.node import Node, has_side_effect

from lt2dsl.kernels import fused
from lt2dsl.kernels.prefetch import l2_prefetch

from .decode_gemv import proj_add_norm_split
from .gdn_step import gdn_step_linear
from .manager import Ctx, Match, Rule, is_call

ALGEBRA = "proj_j(x); ... -> proj_j(x); prefetch_L2(next MAX_BYTES of the weight stream) on a side stream"
# How far ahead of the projections L2 is filled: about half the H100's 50 MB L2, so the prefetched
# bytes leave room for what the kernels between the projections touch and are not evicted before
# their projection reads them. A starting point to tune on the card (`bench/l2_prefetch.py
# --max-mb` for one projection), not a measured optimum.
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
def prefetch_after(anchor, *weights: torch.Tensor, ranges: tuple[tuple[int, int], ...] = ()) -> None:
    """Once the work queued on the current stream (through the product `anchor`) is done, prefetch
    bytes [offset, offset + n) of each weight (`ranges`, one (offset, n) a weight) into L2 on the
    side stream; the current stream does not wait. Nothing happens where `applies(anchor)` is
    false."""
    if not applies(anchor):
        return
    t = _first_tensor(anchor)
    side = _side(t.device)
    side.wait_stream(torch.cuda.current_stream(t.device))
    with torch.cuda.stream(side):
        for w, (offset, n) in zip(weights, ranges, strict=True):
            l2_prefetch(w, n, offset=offset)
    _FORKED.add(side.device.index)


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
    prefetch_after(y, w_next, ranges=((0, MAX_BYTES),))
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
    if is_call(node, gdn_step_linear):
        return [node.args[15]]
    if ctx.module(node, nn.Linear) is not None:
        return [f"{node.target}.weight"]
    return None


def _nbytes(ctx: Ctx, w: Node | str) -> int | None:
    """Bytes of a weight operand: a parameter, or `fused.concat_weights` of parameters (its rows
    padded as it pads them); None for anything else."""
    if isinstance(w, Node) and is_call(w, fused.concat_weights):
        parts = [_param(ctx, a) for a in w.args]
        if any(p is None for p in parts) or not parts:
            return None
        rows = sum(p.shape[0] for p in parts)
        rows += (-rows) % fused.CAT_ALIGN
        return rows * parts[0][0].numel() * parts[0].element_size()
    p = _param(ctx, w)
    return None if p is None else p.numel() * p.element_size()


def _param(ctx: Ctx, w) -> torch.Tensor | None:
    target = w if isinstance(w, str) else w.target if isinstance(w, Node) and w.op == "get_attr" else None
    if target is None:
        return None
    try:
        return ctx.gm.get_parameter(target)
    except AttributeError:
        return None


def plan(ctx: Ctx, budget: int) -> dict[Node, list[tuple[Node | str, int, int]]]:
    """{projection: [(weight, offset, n), ...]}: what `prefetch_after` asks for after it (module
    docstring), with the weights laid out as one stream in the order the projections read them."""
    projs = [(n, weights(ctx, n)) for n in ctx.graph.nodes if weights(ctx, n) is not None]
    sizes = [[_nbytes(ctx, w) for w in ws] for _, ws in projs]
    if any(b is None for bs in sizes for b in bs):  # sizes unknown: the next projection's weights
        return {n: [(w, 0, budget) for w in projs[(i + 1) % len(projs)][1]] for i, (n, _) in enumerate(projs)}
    stream = [(w, b) for (_, ws), bs in zip(projs, sizes) for w, b in zip(ws, bs)]
    spans = stream_spans([sum(bs) for bs in sizes], budget)
    return {node: _slice(stream, lo, hi) for (node, _), (lo, hi) in zip(projs, spans)}


def stream_spans(sizes: list[int], budget: int) -> list[tuple[int, int]]:
    """[lo, hi) of the weight stream asked for after each projection, given each projection's bytes
    in order: from where the last request ended (never before the end of the projection's own
    weights) to `budget` past them; the last (the head) asks for the first `budget` bytes, the next
    step's, so every byte is asked for once a step."""
    total = sum(sizes)
    out, asked, end = [], min(budget, total), 0
    for i, b in enumerate(sizes):
        end += b
        if i == len(sizes) - 1:
            out.append((0, min(budget, total)))
        else:
            lo, hi = max(asked, end), min(end + budget, total)
            out.append((lo, max(lo, hi)))
            asked = max(asked, hi)
    return out


def _slice(stream: list[tuple[Node | str, int]], lo: int, hi: int) -> list[tuple[Node | str, int, int]]:
    """Bytes [lo, hi) of the stream as (weight, offset, n) pieces."""
    out, start = [], 0
    for w, b in stream:
        a, z = max(lo, start), min(hi, start + b)
        if z > a:
            out.append((w, a - start, z - a))
        start += b
    return out


def match(ctx: Ctx, node: Node) -> Match | None:
    if weights(ctx, node) is None or any(is_call(u, prefetch_after) for u in node.users):
        return None
    if not hasattr(ctx, "_l2_plan"):
        ctx._l2_plan = plan(ctx, MAX_BYTES)
    pieces = ctx._l2_plan.get(node)
    return {"node": node, "pieces": pieces} if pieces else None


def _target(w: Node | str) -> str:
    return w.target if isinstance(w, Node) else w


def rewrite(ctx: Ctx, m: Match) -> None:
    node = m["node"]
    with ctx.graph.inserting_after(node):
        call = ctx.graph.call_function(prefetch_after, (node,))
    with ctx.graph.inserting_before(call):
        # a parameter is read anew here: the projection's own `get_attr` may come after this point
        ws = [w if isinstance(w, Node) and w.op != "get_attr" else ctx.param(_target(w))
              for w, _, _ in m["pieces"]]  # fmt: skip
    call.args = (node, *ws)
    call.kwargs = {"ranges": tuple((off, n) for _, off, n in m["pieces"])}
    out = next(n for n in reversed(ctx.graph.nodes) if n.op == "output")
    if not is_call(out.prev, prefetch_join):
        with ctx.graph.inserting_before(out):
            ctx.graph.call_function(prefetch_join, ())


RULE = Rule("l2_prefetch", ALGEBRA, pattern, replacement, match, rewrite)
