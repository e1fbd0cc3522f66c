"""Rule `gemv_pdl` (opt-in, needs `decode_gemv`): the decode GEMVs as programmatic dependent
launches.

    proj_add_norm_split(..., pdl=False)   ->   proj_add_norm_split(..., pdl=True)

On an sm_90 card each GEMV of a static-cache decode step then launches while the kernel before it
still runs, asks L2 for the head of its weight, waits for that kernel's writes and only then lets
the next one launch (`kernels.gemv.triton_gemv`, `PDL`): the weight stream crosses the boundary
between two projections (a GEMV's last wave, the launch gap) where one launch after another
leaves HBM idle. Values are unchanged (the same kernel, the same order of every read after the
wait); elsewhere (the CPU, older cards, prefill, training) the flag is ignored.

Off by default until measured: `lt2dsl bench decode --rules default,+decode_gemv,+decode_gemv+gemv_pdl`.
"""

from __future__ import annotations

from torch.fx.node import Node

from .decode_gemv import proj_add_norm_split
from .manager import Ctx, Match, Rule, is_call

ALGEBRA = "proj_add_norm_split(...) -> proj_add_norm_split(..., pdl=True): GEMVs as dependent launches"


def pattern(*args, **kwargs):
    return proj_add_norm_split(*args, **{**kwargs, "pdl": False})


def replacement(*args, **kwargs):
    return proj_add_norm_split(*args, **{**kwargs, "pdl": True})


def match(ctx: Ctx, node: Node) -> Match | None:
    if not is_call(node, proj_add_norm_split) or node.kwargs.get("pdl", False):
        return None
    return {"node": node}


def rewrite(ctx: Ctx, m: Match) -> None:
    node = m["node"]
    node.kwargs = {**node.kwargs, "pdl": True}


RULE = Rule("gemv_pdl", ALGEBRA, pattern, replacement, match, rewrite, needs=("decode_gemv",))
