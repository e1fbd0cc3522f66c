"""What the surface rules look at: every item, every argument list with its option schema.

`Ctx` walks the program once and answers the questions every rule asks: which `let`s exist,
which kind a call names (through `let` chains), which options an argument list may use.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup
from lt2dsl.ir.settings import EXIT_GATE_OPTIONS, LOOP_OPTIONS, LOOP_T_KEYS, MODEL_SETTINGS
from lt2dsl.ir.spec import LayerSpec, Option
from lt2dsl.ir.specs.channel import MLP_KINDS, NORM_KINDS

LOOP_SCHEMA = LOOP_OPTIONS
# Enum choices that may also be written as a call, with the call's options.
CALL_CHOICES: dict[tuple[str, str], tuple[Option, ...]] = {("exit", "gate"): EXIT_GATE_OPTIONS}
SETTINGS = {o.name: o for o in MODEL_SETTINGS}
OVERRIDE_ONLY = LOOP_T_KEYS


@dataclass(frozen=True)
class ArgList:
    """Arguments written in one place, and the options they may name.

    `node` is the call or loop that holds them; `owner` names it in messages (`gdn`, `loop`,
    `swiglu`); `kind` is the layer kind for block calls (None otherwise).
    """

    node: n.Node
    args: tuple[n.Arg, ...]
    options: tuple[Option, ...]
    owner: str
    kind: str | None = None

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    @property
    def positional(self) -> Option | None:
        return next((o for o in self.options if o.positional), None)

    def option_of(self, arg: n.Arg) -> Option | None:
        """The option an argument sets: its name, or the first positional value's option."""
        if arg.name is not None:
            return self.option(arg.name)
        first = next(a for a in self.args if a.name is None)
        return self.positional if first is arg else None


@dataclass(frozen=True)
class Site:
    """A value written for an option: a setting, or an argument of an argument list."""

    value: n.Node
    option: Option
    what: str  # "setting `dim`", "option `heads` of `gdn`"
    name_span: object = None


class Ctx:
    def __init__(self, program: n.Program, overrides: dict[str, n.Node] | None = None):
        self.program = program
        self.overrides = dict(overrides or {})
        self.lets: dict[str, n.Let] = {}
        for let in program.lets:
            self.lets.setdefault(let.name, let)

    # ---- items ---------------------------------------------------------------------------------

    @cached_property
    def items(self) -> list[tuple[n.Node, n.Let | None]]:
        """Every item of the body and of every `let`, nested ones included, with its `let`."""
        out: list[tuple[n.Node, n.Let | None]] = []
        todo = [(i, None) for i in reversed(self.program.body)]
        todo += [(let.item, let) for let in reversed(self.program.lets)]
        while todo:
            item, let = todo.pop()
            out.append((item, let))
            todo += [(c, let) for c in reversed(children(item))]
        return out

    def block_calls(self) -> Iterator[tuple[n.Call, n.Let | None]]:
        """Calls in block position: stack items and `par` members."""
        for item, let in self.items:
            if isinstance(item, n.Call):
                yield item, let
            elif isinstance(item, n.Par):
                yield from ((c, let) for c in item.calls)

    def binding(self, call: n.Call) -> n.Node | None:
        """What a call finally stands for: itself for a kind, the bound item through `let`s
        (None when the chain is unknown or loops back on itself)."""
        if self.is_let_use(call):
            return self._bound(call.name)
        return call if lookup(call.name) is not None else None

    def is_let_use(self, node: n.Node) -> bool:
        return isinstance(node, n.Call) and node.name in self.lets and lookup(node.name) is None

    def _bound(self, name: str) -> n.Node | None:
        """`binding` of a `let` name, memoised for every name on the chain it walks: a chain of
        k `let`s costs O(k) once, not O(k) per use (a long chain would make checking quadratic)."""
        memo = self.__dict__.setdefault("_bound_memo", {})
        chain: list[str] = []
        result: n.Node | None = None
        while name not in memo:
            if name in chain:  # the chain loops back on itself
                break
            chain.append(name)
            item = self.lets[name].item
            if not self.is_let_use(item):
                result = item if not isinstance(item, n.Call) or lookup(item.name) is not None else None
                break
            name = item.name
        else:
            result = memo[name]
        for c in chain:
            memo[c] = result
        return result

    def spec_of(self, call: n.Call) -> LayerSpec | None:
        bound = self.binding(call)
        return lookup(bound.name) if isinstance(bound, n.Call) else None

    # ---- argument lists and values -----------------------------------------------------------

    @cached_property
    def arglists(self) -> list[ArgList]:
        """Every argument list with its schema: block calls, loops and call values within."""
        out: list[ArgList] = []
        for call, _ in self.block_calls():
            if (spec := self.spec_of(call)) is not None:
                out.append(
                    ArgList(
                        call,
                        call.args,
                        spec.options,
                        spec.kind if call.name == spec.kind else call.name,
                        kind=spec.kind,
                    )
                )
        for item, _ in self.items:
            if isinstance(item, n.Loop):
                out.append(ArgList(item, item.options, LOOP_SCHEMA, "loop"))
        for s in self.settings_sites():
            out += value_arglists(s.value, s.option)
        for al in list(out):
            for a in al.args:
                if (o := al.option_of(a)) is not None:
                    out += value_arglists(a.value, o)
        return out

    def settings_sites(self) -> Iterator[Site]:
        for s in self.program.settings:
            if (o := SETTINGS.get(s.name)) is not None:
                yield Site(s.value, o, f"setting `{s.name}`", s.name_span)

    def sites(self) -> Iterator[Site]:
        """Every value written for a known option."""
        yield from self.settings_sites()
        for al in self.arglists:
            for a in al.args:
                if (o := al.option_of(a)) is not None:
                    yield Site(a.value, o, f"`{o.name}` of `{al.owner}`", a.name_span)


def children(item: n.Node) -> tuple[n.Node, ...]:
    match item:
        case n.Loop() | n.Repeat():
            return item.body
        case n.Times():
            return (item.item,)
    return ()


def value_arglists(value: n.Node, option: Option) -> list[ArgList]:
    """The argument list inside a call value (`swiglu(hidden=...)`), when its name is known."""
    if not isinstance(value, n.Call):
        return []
    schema = None
    if option.type == "mlp":
        schema = MLP_KINDS.get(value.name)
    elif option.type == "norm":
        schema = NORM_KINDS.get(value.name)
    elif option.type == "enum":
        schema = CALL_CHOICES.get((option.name, value.name))
    return [] if schema is None else [ArgList(value, value.args, schema, value.name)]


# ---- the resolved model, for the shape and kernel rules ---------------------------------------

# The model settings a mixer option comes from when the call does not write it, most direct
# first: the model's head dim is `head_dim`, or `dim / heads` when that is not written.
FROM_SETTING = {
    "heads": ("heads", "dim"),
    "head_dim": ("head_dim", "heads", "dim"),
    "kv_heads": ("kv_heads", "heads"),
    "max_len": ("max_len",),
}


def span_key(s) -> tuple:
    return (s.file, s.line, s.col, s.end_line, s.end_col)


class ShapeCtx:
    """The resolved model, with the way back from each mixer to what the user wrote."""

    def __init__(self, ctx: Ctx, model: n.Model):
        self.ctx, self.model, self.cfg = ctx, model, model.config
        self.settings = {s.name: s for s in ctx.program.settings}
        self.calls = {span_key(c.span): c for c, _ in ctx.block_calls() if c.span.known}

    def mixers(self) -> Iterator[n.Mixer]:
        todo = list(reversed(self.model.body))
        while todo:
            stage = todo.pop()
            if isinstance(stage, n.LoopBlock):
                todo += reversed(stage.body)
            else:
                yield from stage.mixers

    def call_of(self, m: n.Mixer) -> n.Call | None:
        return self.calls.get(span_key(m.span))

    def written(self, call: n.Call | None, name: str) -> n.Arg | None:
        """The argument that sets option `name` of this call (following `let` chains)."""
        node, seen = call, set()
        spec = self.ctx.spec_of(call) if call is not None else None
        positional = next((o.name for o in spec.options if o.positional), None) if spec else None
        while isinstance(node, n.Call) and node.name not in seen:
            seen.add(node.name)
            first_pos = next((a for a in node.args if a.name is None), None)
            for a in node.args:
                if a.name == name or (a is first_pos and positional == name):
                    return a
            if node.name not in self.ctx.lets or lookup(node.name) is not None:
                return None
            node = self.ctx.lets[node.name].item
        return None

    def where(self, m: n.Mixer, names: tuple[str, ...], inherited: tuple[str, ...] = ()):
        """The most precise span for a problem with options `names` of mixer `m`: the value the
        user wrote on the call, else the model setting it inherits (`inherited` lists which
        options do), else the call's name."""
        call = self.call_of(m)
        for name in names:
            if (a := self.written(call, name)) is not None:
                return a.value.span
        for name in names:
            for setting in FROM_SETTING.get(name, ()) if name in inherited else ():
                if (s := self.settings.get(setting)) is not None:
                    return s.value.span
        if call is not None:
            return call.name_span
        return m.span

    def setting_span(self, *names: str):
        """The value span of the first of these settings the user wrote, else the program's."""
        for name in names:
            if (s := self.settings.get(name)) is not None:
                return s.value.span
        return self.ctx.program.span
