"""Leaf functions of the lowered graph: one registry, one tracer that keeps them whole.

`@leaf` records a function. While `LeafTracer` traces, a call of a recorded function with a
traced value among its arguments becomes one `call_function` node (target: the function
itself) instead of being traced into; called with plain values it simply runs. Leaves are what
touches caches and positions (code that branches on whether a cache exists) and every mixer
core, so the graph shows projections, activations and norms as nodes the fusion passes can
rewrite, and one node per core op. The kernels' Triton paths are `torch.library` custom ops,
leaves by nature, and need no registration.

A leaf stays a leaf however it is called: `from m import f; f(x)`, `m.f(x)`, or from a helper
function in another module. The tracer hands torch the recorded functions (`autowrap_functions`,
which covers the globals of every traced `forward`) and itself swaps them, for the duration of
the trace, in the globals of every loaded `lt2dsl` module and of the modules defining them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
import torch.fx
from torch.fx.node import map_aggregate

F = TypeVar("F", bound=Callable[..., Any])

_LEAVES: dict[int, Callable[..., Any]] = {}


def leaf(fn: F) -> F:
    """Record `fn` as a leaf of the lowered graph (see the module docstring); returns `fn`."""
    _LEAVES[id(fn)] = fn
    return fn


def leaves() -> tuple[Callable[..., Any], ...]:
    """Every recorded leaf function, in registration order."""
    return tuple(_LEAVES.values())


def is_leaf(fn: object) -> bool:
    return _LEAVES.get(id(fn)) is fn


def _traced_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as the tracer sees it: one graph node when an argument is traced, a plain call else."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        found: list[torch.fx.Proxy] = []
        map_aggregate((args, kwargs), lambda a: found.append(a) if isinstance(a, torch.fx.Proxy) else None)
        if not found:
            return fn(*args, **kwargs)
        return found[0].tracer.create_proxy("call_function", fn, args, kwargs)

    return call


def _namespaces() -> list[dict[str, Any]]:
    """The globals a leaf may be called from: every loaded lt2dsl module, and the leaves' own."""
    names = {name for name in sys.modules if name == "lt2dsl" or name.startswith("lt2dsl.")}
    names |= {fn.__module__ for fn in _LEAVES.values()}
    return [vars(m) for name in sorted(names) if (m := sys.modules.get(name)) is not None]


@contextmanager
def _leaves_traced() -> Iterator[None]:
    """Swap every recorded leaf in `_namespaces()` for its `_traced_call`, and back."""
    swapped: list[tuple[dict[str, Any], str, Any]] = []
    try:
        for ns in _namespaces():
            for name, value in list(ns.items()):
                if callable(value) and is_leaf(value):
                    swapped.append((ns, name, value))
                    ns[name] = _traced_call(value)
        yield
    finally:
        for ns, name, value in reversed(swapped):
            ns[name] = value


class LeafTracer(torch.fx.Tracer):
    """A `torch.fx.Tracer` that keeps every `@leaf` function as one node wherever it is called."""

    def __init__(self):
        super().__init__(autowrap_functions=leaves())
        self._param_names: dict[int, str] | None = None

    def trace(self, root, concrete_args=None) -> torch.fx.Graph:
        self._param_names = None
        with _leaves_traced():
            return super().trace(root, concrete_args)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        """torch's `Tracer.getattr` for parameters, found by identity in an index of the root's
        parameters (the first name of a shared one, as torch's scan finds) instead of a scan of
        them per access: the scan made a full-size looped model's trace quadratic in its size."""
        if not isinstance(attr_val, torch.nn.Parameter):
            return super().getattr(attr, attr_val, parameter_proxy_cache)
        if self._param_names is None:
            self._param_names = {}
            for name, p in self.root.named_parameters():
                self._param_names.setdefault(id(p), name)
        name = self._param_names.get(id(attr_val))
        if name is None:
            return super().getattr(attr, attr_val, parameter_proxy_cache)
        if name not in parameter_proxy_cache:
            parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
        return parameter_proxy_cache[name]
