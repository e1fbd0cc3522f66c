"""Build small programs from IR nodes (independent of the parser) for cost tests."""

from __future__ import annotations

from lt2dsl.ir import nodes as n
from lt2dsl.passes.overrides import as_node
from lt2dsl.passes.resolve import resolve


def val(v):
    """A value node: text is a name (`sdpa`); numbers and booleans as `--set` takes them."""
    return n.Name(value=v) if isinstance(v, str) else as_node(v)


def call(name: str, **opts) -> n.Call:
    return n.Call(name=name, args=tuple(n.Arg(name=k, value=val(v)) for k, v in opts.items()))


def model(body, **settings) -> n.Model:
    sets = tuple(n.Setting(name=k, value=val(v)) for k, v in settings.items())
    return resolve(n.Program(settings=sets, body=tuple(body)))


def loop(T: int, *items, **opts) -> n.Loop:
    return n.Loop(T=T, body=tuple(items), options=tuple(n.Arg(name=k, value=val(v)) for k, v in opts.items()))
