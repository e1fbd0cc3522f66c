"""The fusion pass `fuse-adjacent`: rules as data, a structural matcher, and the pass driver.

A `Rule` is a pattern / replacement pair in the style of Inductor's `fuse_attention.py`:

* `pattern` and `replacement` are plain functions over tensors: the unfused math the rule looks
  for and the fused call it puts in its place. Tests run both on the same inputs (they must agree
  to fp rounding), and they document the rule next to its one-line `algebra`.
* `match(ctx, node)` recognises the pattern in the lowered `torch.fx` graph from one anchor node,
  by structure only: call targets, module types (`nn.RMSNorm`, `nn.Linear`, `GatedRMSNorm`),
  method names, constant arguments and how many users each intermediate has (an intermediate
  read by anything outside the pattern must survive, so the rule declines). Node names are
  never looked at. It returns the matched nodes, or None.
* `rewrite(ctx, match)` inserts the fused call, reroutes the users and erases the nodes it
  replaced. Parameters are read through new `get_attr` nodes of the original parameters, so the
  fused graph shares them (state_dict, optimiser and gradients are unchanged).

`FuseAdjacent` (a torch.fx `PassBase`) runs the selected rules in `RULES` order, each as one sweep
over a snapshot of the graph, lints the graph, recompiles, counts fires per rule and returns
`PassResult(gm, modified)`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.fx.node import Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from lt2dsl.kernels import fused

BACKENDS = ("reference", "triton", "auto")
Match = dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """One fusion: its name (the `COUNTERS` key), the algebra in one line, the plain-function
    pattern / replacement pair, the graph matcher and rewriter, and the rules whose output it
    matches (`needs`: selecting this rule selects them too)."""

    name: str
    algebra: str
    pattern: Callable
    replacement: Callable
    match: Callable[[Ctx, Node], Match | None]
    rewrite: Callable[[Ctx, Match], None]
    needs: tuple[str, ...] = ()


class Ctx:
    """What a rule sees: the GraphModule, the default kernel backend, and graph-editing helpers."""

    def __init__(self, gm: torch.fx.GraphModule, backend: str):
        self.gm, self.graph, self.backend = gm, gm.graph, backend
        self._cats: dict[tuple, Node] = {}
        # hoisted nodes (weight concatenations) go before the first computation, in creation order
        self._top = next(n for n in self.graph.nodes if n.op != "placeholder")

    # ---- reading --------------------------------------------------------------------------------

    def module(self, node: Any, cls: type | tuple[type, ...]) -> nn.Module | None:
        """The module a `call_module` node calls, when it is an instance of `cls`."""
        if not isinstance(node, Node) or node.op != "call_module":
            return None
        mod = self.gm.get_submodule(node.target)
        return mod if isinstance(mod, cls) else None

    @staticmethod
    def users_in_order(node: Node) -> list[Node]:
        """The users of `node` in graph order. Users come after their input, so a walk forward
        from `node` finds them all; it stops at the last one, which keeps a sweep over an unrolled
        loop of n blocks linear in n (a full-graph order per match is quadratic)."""
        left, found, n = set(node.users), [], node
        while left:
            n = n.next
            if n in left:
                found.append(n)
                left.discard(n)
        return found

    # ---- writing --------------------------------------------------------------------------------

    def param(self, target: str) -> Node:
        """A `get_attr` node of the parameter `target` (at the current insertion point)."""
        return self.graph.get_attr(target)

    def concat(self, targets: tuple[str | None, ...], sizes: tuple[int, ...] | None = None) -> Node:
        """`torch.cat` of the parameters `targets` along dim 0, once per forward: the node sits at
        the top of the graph and is shared by every use (a loop's iterations reuse it). With
        `sizes` (biases), a None target stands for zeros of its size."""
        key = (targets, sizes)
        hit = self._cats.get(key)
        if hit is not None:
            return hit
        with self.graph.inserting_before(self._top):
            params = tuple(None if t is None else self.graph.get_attr(t) for t in targets)
            if sizes is None:
                cat = self.graph.call_function(fused.concat_weights, params)
            else:
                cat = self.graph.call_function(fused.concat_biases, (sizes, *params))
        self._cats[key] = cat
        return cat

    def erase(self, *nodes: Node) -> None:
        """Erase replaced nodes, consumers first; a node something still reads stays."""
        for n in nodes:
            if not erased(n) and not n.users:
                self.graph.erase_node(n)


def erased(node: Node) -> bool:
    return getattr(node, "_erased", False)


def is_call(node: Any, *targets: Callable) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def is_method(node: Any, name: str) -> bool:
    return isinstance(node, Node) and node.op == "call_method" and node.target == name


def only_user(node: Any, user: Node) -> bool:
    """`node` is an intermediate read by `user` alone (once or more)."""
    return isinstance(node, Node) and set(node.users) == {user}


def cast_dtype(node: Any) -> torch.dtype | None:
    """The dtype of an `x.to(dtype)` node, else None."""
    if not (is_method(node, "to") and len(node.args) == 2 and not node.kwargs):
        return None
    return node.args[1] if isinstance(node.args[1], torch.dtype) else None


def is_add(node: Any) -> bool:
    return is_call(node, operator.add, torch.add) and len(node.args) == 2 and not node.kwargs


def is_mul(node: Any) -> bool:
    return is_call(node, operator.mul, torch.mul) and len(node.args) == 2 and not node.kwargs


def graph_backend(gm: torch.fx.GraphModule) -> str:
    """The kernel backend the lowered graph's leaves were built with ("auto" when mixed or none)."""
    seen = set()
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.kwargs.get("backend") in BACKENDS:
            seen.add(n.kwargs["backend"])
        seen.update(a for a in n.args if isinstance(a, str) and a in BACKENDS)
    return seen.pop() if len(seen) == 1 else "auto"


class FuseAdjacent(PassBase):
    """Pass `fuse-adjacent`: apply `rules` (in order) to a lowered GraphModule, in place."""

    name = "fuse-adjacent"

    def __init__(self, rules: list[Rule]):
        super().__init__()
        self.rules = rules
        self.counts: dict[str, int] = {r.name: 0 for r in rules}

    def requires(self, graph_module: torch.fx.GraphModule) -> None:
        graph_module.graph.lint()

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        graph_module.graph.lint()

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        ctx = Ctx(graph_module, graph_backend(graph_module))
        for rule in self.rules:
            self.counts[rule.name] += self._sweep(ctx, rule)
        modified = any(self.counts.values())
        if modified:
            graph_module.recompile()
        return PassResult(graph_module, modified)

    @staticmethod
    def _sweep(ctx: Ctx, rule: Rule) -> int:
        fired = 0
        for node in list(ctx.graph.nodes):
            if erased(node):  # by an earlier rewrite of this sweep
                continue
            m = rule.match(ctx, node)
            if m is not None:
                rule.rewrite(ctx, m)
                fired += 1
        return fired
