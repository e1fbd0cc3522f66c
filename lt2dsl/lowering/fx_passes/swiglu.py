"""Rule `swiglu`: the SwiGLU MLP's activation and product → one elementwise kernel.

    h = silu(a) * b   ->   h = swiglu(a, b)

The SiLU output must be read by the product alone (else it has to exist anyway, so nothing is
gained and the rule declines).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.node import Node

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive

from .manager import Ctx, Match, Rule, is_call, is_mul, only_user

ALGEBRA = "silu(a) * b -> swiglu(a, b)"


def pattern(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return naive.swiglu_ref(a, b)


def replacement(a: torch.Tensor, b: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    return fused.swiglu(a, b, backend=backend)


def _silu(node) -> bool:
    return (
        is_call(node, F.silu, torch.nn.functional.silu)
        and len(node.args) == 1
        and not node.kwargs.get("inplace", False)
        and set(node.kwargs) <= {"inplace"}
    )


def match(ctx: Ctx, node: Node) -> Match | None:
    if not is_mul(node):
        return None
    for i in (0, 1):
        act, other = node.args[i], node.args[1 - i]
        if _silu(act) and only_user(act, node) and isinstance(other, Node):
            return {"mul": node, "silu": act, "a": act.args[0], "b": other}
    return None


def rewrite(ctx: Ctx, m: Match) -> None:
    with ctx.graph.inserting_before(m["mul"]):
        out = ctx.graph.call_function(fused.swiglu, (m["a"], m["b"]), {"backend": ctx.backend})
    m["mul"].replace_all_uses_with(out)
    ctx.erase(m["mul"], m["silu"])


RULE = Rule("swiglu", ALGEBRA, pattern, replacement, match, rewrite)
