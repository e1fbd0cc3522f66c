"""Structure (E03xx, W03xx): stacks, `let` bindings, settings and argument lists as a whole."""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic, Label, error, warning
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup
from lt2dsl.ir.settings import MODEL_SETTINGS
from lt2dsl.source import Span
from lt2dsl.suggest import quoted
from lt2dsl.validate.context import Ctx, children
from lt2dsl.validate.rules import rule


def apart(primary: Span, *labels: Label) -> tuple[Label, ...]:
    """Secondary labels on other lines than the primary span (the renderer quotes one line per
    label; a second copy of the same line reads as noise)."""
    return tuple(lb for lb in labels if lb.span.line != primary.line or lb.span.file != primary.file)


def head_span(item: n.Node) -> Span:
    """`loop T=4` or `repeat 2`: the part of a stack before `<` (a multi-line span reads badly)."""
    end = item.T_span if isinstance(item, n.Loop) else getattr(item, "n_span", item.span)
    if not (item.span.known and end.known):
        return item.span
    return Span(
        file=item.span.file,
        line=item.span.line,
        col=item.span.col,
        end_line=end.end_line,
        end_col=end.end_col,
    )


@rule("E0301")
def check_empty_stack(ctx: Ctx) -> Iterator[Diagnostic]:
    """Empty loop or repeat.

    What it checks:
        A `loop` or `repeat` whose stack `< >` holds no block.

    Why it matters:
        An empty stack does nothing; it is usually a block that got lost in an edit.

    Example:
        dim = 1024
        gdn
        loop T=4 < >

    Use instead:
        dim = 1024
        gdn
        loop T=4 < gdn >
    """
    for item, _ in ctx.items:
        if isinstance(item, n.Loop | n.Repeat) and not item.body:
            what = "loop" if isinstance(item, n.Loop) else "repeat"
            yield error(
                "E0301",
                f"empty {what}",
                head_span(item),
                label="this stack has no blocks",
                help="put blocks between `<` and `>`, or remove the stack",
            )


@rule("E0302")
def check_empty_model(ctx: Ctx) -> Iterator[Diagnostic]:
    """Model without blocks.

    What it checks:
        A model (or a file without `model { }`) that has settings and `let`s but no block.

    Why it matters:
        Without a block there is nothing to compile: an embedding straight into the head.

    Example:
        model m {
          dim = 1024
          let a = gdn
        }

    Use instead:
        model m {
          dim = 1024
          let a = gdn
          loop T=4 < a >
        }
    """
    p = ctx.program
    if p.body:
        return
    span = p.span if p.span.known else Span()
    yield error(
        "E0302",
        "the model has no blocks",
        span,
        label="no blocks in this model",
        help="add a stack of blocks, e.g. `loop T=4 < gdn; gdn; dsa >`",
    )


@rule("E0303")
def check_let_before_definition(ctx: Ctx) -> Iterator[Diagnostic]:
    """`let` used before its definition.

    What it checks:
        A block (or another `let`) uses a `let` name on a line before the `let` that defines it.

    Why it matters:
        Reading a file top to bottom, a name should be defined before it is used; out-of-order
        bindings are also how accidental recursion starts.

    Example:
        dim = 1024
        loop T=4 < sparse >
        let sparse = dsa(topk=64)

    Use instead:
        dim = 1024
        let sparse = dsa(topk=64)
        loop T=4 < sparse >
    """
    for call, _ in ctx.block_calls():
        let = ctx.lets.get(call.name)
        if let is None or not (call.span.known and let.span.known):
            continue
        if call.span.key() < let.span.key():
            yield error(
                "E0303",
                f"`{call.name}` is used before its definition",
                call.name_span,
                label="used here",
                labels=apart(call.name_span, Label(span=let.name_span, message="defined here")),
                help=f"move `let {call.name} = ...` above its first use",
            )


@rule("E0304")
def check_let_shadows_kind(ctx: Ctx) -> Iterator[Diagnostic]:
    """`let` named like a layer kind.

    What it checks:
        A `let` whose name is a layer kind or alias (`let gdn = gdn(heads=8)`).

    Why it matters:
        Every later `gdn` would silently mean the binding, not the layer, which makes the
        file say something other than what it reads as.

    Example:
        dim = 1024
        let gdn = gdn(heads=8)
        loop T=4 < gdn >

    Use instead:
        dim = 1024
        let gdn8 = gdn(heads=8)
        loop T=4 < gdn8 >
    """
    for let in ctx.program.lets:
        if (spec := lookup(let.name)) is not None:
            what = "a layer kind" if spec.kind == let.name else f"an alias of the layer `{spec.kind}`"
            yield error(
                "E0304",
                f"`let {let.name}` shadows a layer kind",
                let.name_span,
                label=f"`{let.name}` is {what}",
                help=f"choose another name, e.g. `{let.name}_block`",
            )


@rule("E0305")
def check_duplicate_setting(ctx: Ctx) -> Iterator[Diagnostic]:
    """Setting given twice.

    What it checks:
        The same model setting is assigned twice.

    Why it matters:
        Only one of the two values can win; which one the user meant is unclear.

    Example:
        dim = 1024
        dim = 2048
        gdn

    Use instead:
        dim = 2048
        gdn
    """
    first: dict[str, n.Setting] = {}
    for s in ctx.program.settings:
        if s.name not in first:
            first[s.name] = s
            continue
        yield error(
            "E0305",
            f"setting `{s.name}` is given more than once",
            s.name_span,
            label="set again here",
            labels=apart(s.name_span, Label(span=first[s.name].name_span, message="first set here")),
            help="remove one of the two",
        )


@rule("E0306")
def check_duplicate_option(ctx: Ctx) -> Iterator[Diagnostic]:
    """Option given twice in one call.

    What it checks:
        One argument list names the same option twice, or passes it both by position and by name
        (`dsa(64, topk=128)`).

    Why it matters:
        Only one value can be used; the other is a leftover the user would wrongly rely on.

    Example:
        dim = 1024
        gdn(heads=8, heads=16)

    Use instead:
        dim = 1024
        gdn(heads=16)
    """
    for al in ctx.arglists:
        seen: dict[str, n.Arg] = {}
        for a in al.args:
            opt = al.option_of(a)
            name = a.name if a.name is not None else (opt.name if opt else None)
            if name is None:
                continue
            if name in seen:
                span = a.name_span if a.name is not None else a.span
                yield error(
                    "E0306",
                    f"`{name}` is given more than once",
                    span,
                    label="given again here",
                    labels=apart(span, Label(span=_arg_span(seen[name]), message="first given here")),
                    help="remove one of the two",
                )
            else:
                seen[name] = a


def _arg_span(a: n.Arg) -> Span:
    return a.name_span if a.name is not None else a.span


@rule("E0307")
def check_let_recursion(ctx: Ctx) -> Iterator[Diagnostic]:
    """Recursive `let`.

    What it checks:
        A `let` that uses itself, directly or through other `let`s.

    Why it matters:
        Expanding the binding would never end: the model would have infinitely many blocks.

    Example:
        dim = 1024
        let a = loop T=2 < gdn; a >
        a

    Use instead:
        dim = 1024
        let a = loop T=2 < gdn; gdn >
        a
    """
    uses = {name: _uses(ctx, let.item) for name, let in ctx.lets.items()}
    cyclic = on_cycles(uses)
    reported: set[frozenset[str]] = set()
    for name in (name for name in ctx.lets if name in cyclic):
        cycle = _cycle_from(name, uses)
        if cycle is None or frozenset(cycle) in reported:
            continue
        reported.add(frozenset(cycle))
        let = ctx.lets[name]
        path = " → ".join([*cycle, cycle[0]])
        yield error(
            "E0307",
            f"`{name}` is defined in terms of itself",
            let.name_span,
            label="recursive binding",
            notes=(f"the cycle: {path}",),
            help="a `let` can use only other, non-recursive bindings; use `loop T=n` to repeat blocks",
        )


def _uses(ctx: Ctx, item: n.Node) -> list[str]:
    out, todo = [], [item]
    while todo:
        it = todo.pop()
        calls = [it] if isinstance(it, n.Call) else list(it.calls) if isinstance(it, n.Par) else []
        out += [c.name for c in calls if c.name in ctx.lets and lookup(c.name) is None]
        todo += children(it)
    return out


def on_cycles(uses: dict[str, list[str]]) -> set[str]:
    """The names that lie on a cycle of `uses`: Tarjan's strongly connected components, without
    recursion (a chain of thousands of `let`s is legal input), in time linear in the graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: list[str] = []
    stacked: set[str] = set()
    out: set[str] = set()
    for root in uses:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                on_stack.append(v)
                stacked.add(v)
            succ = uses.get(v, [])
            if i < len(succ):
                work.append((v, i + 1))
                w = succ[i]
                if w not in index:
                    work.append((w, 0))
                elif w in stacked:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = on_stack.pop()
                    stacked.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in succ:
                    out.update(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def _cycle_from(start: str, uses: dict[str, list[str]]) -> list[str] | None:
    """The first cycle through `start` (depth-first, in source order), as a list of names."""
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        name, path = stack.pop()
        for u in reversed(uses.get(name, [])):
            if u == start:
                return path
            if u not in seen:
                seen.add(u)
                stack.append((u, [*path, u]))
    return None


@rule("E0308")
def check_required_settings(ctx: Ctx) -> Iterator[Diagnostic]:
    """Required setting missing.

    What it checks:
        The model does not set `dim`, neither in the file nor with `--set dim=...`.

    Why it matters:
        Every shape in the model follows from the model width; there is no sensible default.

    Example:
        loop T=4 < gdn; dsa >

    Use instead:
        dim = 1024
        loop T=4 < gdn; dsa >
    """
    given = {s.name for s in ctx.program.settings}
    for o in MODEL_SETTINGS:
        if o.required and o.name not in given:
            p = ctx.program
            span = p.span if p.span.known else Span()
            yield error(
                "E0308",
                f"the model does not set `{o.name}`",
                span,
                label=f"`{o.name}` is missing",
                help=f"add `{o.name} = ...` to the model, or pass `--set {o.name}=...`",
                notes=(f"`{o.name}`: {o.doc}",),
            )


@rule("E0309")
def check_positional_count(ctx: Ctx) -> Iterator[Diagnostic]:
    """More than one positional value.

    What it checks:
        A call passes two or more values without names (`dsa(64, 4)`).

    Why it matters:
        Only one option per kind may be given by position; which option a second bare value
        would set is anyone's guess.

    Example:
        dim = 1024
        dsa(64, 4)

    Use instead:
        dim = 1024
        dsa(64, index_heads=4)
    """
    for al in ctx.arglists:
        positional = [a for a in al.args if a.name is None]
        if al.positional is None or len(positional) < 2:
            continue
        for a in positional[1:]:
            yield error(
                "E0309",
                f"`{al.owner}` takes at most one positional value",
                a.span,
                label="a second positional value",
                help=f"name it: `option=value`; the positional value of `{al.owner}` is "
                f"`{al.positional.name}`",
            )


@rule("E0310")
def check_positional_allowed(ctx: Ctx) -> Iterator[Diagnostic]:
    """Positional value where none is taken.

    What it checks:
        A call or loop passes a value without a name, but its kind has no positional option
        (`gdn(8)`, `loop T=2, true < ... >`).

    Why it matters:
        Without a name the value could mean any option; the kinds that take one say which
        (`swa(512)` is the window, `dsa(2k)` the top-k).

    Example:
        dim = 1024
        gdn(8)

    Use instead:
        dim = 1024
        gdn(heads=8)
    """
    for al in ctx.arglists:
        if al.positional is not None:
            continue
        names = [o.name for o in al.options]
        for a in (a for a in al.args if a.name is None):
            yield error(
                "E0310",
                f"`{al.owner}` takes no positional value",
                a.span,
                label="value without a name",
                help=f"name it: the options of `{al.owner}` are {quoted(names)}"
                if names
                else f"`{al.owner}` takes no options",
            )


@rule("E0311")
def check_duplicate_let(ctx: Ctx) -> Iterator[Diagnostic]:
    """`let` defined twice.

    What it checks:
        Two `let`s bind the same name.

    Why it matters:
        Uses of the name could mean either binding.

    Example:
        dim = 1024
        let a = gdn
        let a = dsa
        a

    Use instead:
        dim = 1024
        let a = gdn
        let b = dsa
        a; b
    """
    for let in ctx.program.lets:
        first = ctx.lets[let.name]
        if first is not let:
            yield error(
                "E0311",
                f"`{let.name}` is defined more than once",
                let.name_span,
                label="defined again here",
                labels=apart(let.name_span, Label(span=first.name_span, message="first defined here")),
                help="rename one of the two",
            )


@rule("E0312")
def check_par_members(ctx: Ctx) -> Iterator[Diagnostic]:
    """`par` with fewer than two mixers, or with a member that is not a mixer.

    What it checks:
        A `par(...)` with a single member, or a member naming a `let` that is bound to a loop,
        a repeat or a copy rather than to one mixer call.

    Why it matters:
        `par` sums the outputs of several mixers inside one block; one mixer is just a block,
        and a stack cannot run as a branch of a block.

    Example:
        dim = 1024
        let pair = loop T=2 < gdn >
        par(pair, swa)

    Use instead:
        dim = 1024
        let fast = gdn(heads=8)
        par(fast, swa)
    """
    for item, _ in ctx.items:
        if not isinstance(item, n.Par):
            continue
        if len(item.calls) < 2:
            yield error(
                "E0312",
                "`par` needs at least two mixers",
                item.span,
                label="a single mixer",
                help=f"write the block on its own: `{item.calls[0].name}`, or add a second mixer",
            )
        for c in item.calls:
            bound = ctx.binding(c)
            if c.name in ctx.lets and bound is not None and not isinstance(bound, n.Call):
                yield error(
                    "E0312",
                    f"`{c.name}` is not a single mixer",
                    c.name_span,
                    label=f"bound to a {bound.kind}",
                    labels=apart(c.name_span, Label(span=ctx.lets[c.name].name_span, message="bound here")),
                    help="a `par` branch is one mixer call",
                )


@rule("E0313")
def check_let_use_options(ctx: Ctx) -> Iterator[Diagnostic]:
    """Options on a `let` that is not a single call.

    What it checks:
        A use of a `let` passes options (`blk(heads=4)`), but the binding is a loop, a repeat,
        a copy or a `par`, which has no options to override.

    Why it matters:
        Options on a use override the options of the bound call; on a stack they would have to
        reach every block inside, which the language does not do implicitly.

    Example:
        dim = 1024
        let blk = loop T=2 < gdn; gdn >
        blk(heads=4)

    Use instead:
        dim = 1024
        let blk = loop T=2 < gdn(heads=4); gdn(heads=4) >
        blk
    """
    for call, _ in ctx.block_calls():
        if not call.args or call.name not in ctx.lets or lookup(call.name) is not None:
            continue
        bound = ctx.binding(call)
        if bound is not None and not isinstance(bound, n.Call):
            yield error(
                "E0313",
                f"`{call.name}` is a {bound.kind}, which takes no options",
                call.span,
                label="options on a stack",
                labels=apart(call.span, Label(span=ctx.lets[call.name].name_span, message="bound here")),
                help="put the options on the blocks inside the binding",
            )


@rule("W0301")
def check_unused_let(ctx: Ctx) -> Iterator[Diagnostic]:
    """Unused `let`.

    What it checks:
        A `let` whose name no block uses.

    Why it matters:
        The binding is not part of the model; either it is left over or a use was forgotten.

    Example:
        dim = 1024
        let sparse = dsa(topk=64)
        loop T=4 < gdn >

    Use instead:
        dim = 1024
        let sparse = dsa(topk=64)
        loop T=4 < gdn; sparse >
    """
    used: set[str] = set()
    for call, let in ctx.block_calls():
        if let is None or let.name != call.name:
            used.add(call.name)
    for name, let in ctx.lets.items():
        if name not in used and lookup(name) is None:
            yield warning(
                "W0301",
                f"`{name}` is never used",
                let.name_span,
                label="defined here",
                help=f"use it in a stack, or remove `let {name}`",
            )


@rule("W0302")
def check_nested_loops(ctx: Ctx) -> Iterator[Diagnostic]:
    """Nested loops.

    What it checks:
        A `loop` inside another loop's stack, written there or brought in through a `let`.

    Why it matters:
        It is legal, and the effective depth multiplies (outer T × inner T × blocks), but it is
        easy to get by accident and expensive: the warning makes it visible.

    Example:
        dim = 1024
        loop T=2 < gdn; loop T=3 < dsa > >

    Use instead:
        dim = 1024
        loop T=2 < gdn; dsa; dsa; dsa >
    """
    for item, _ in ctx.items:
        if not isinstance(item, n.Loop):
            continue
        for inner, via in _loops_within(ctx, item.body):
            notes = (f"`{via}` is bound to a loop",) if via else ()
            span = head_span(inner) if via is None else inner.name_span
            yield warning(
                "W0302",
                "loop nested inside another loop",
                span,
                label="inner loop",
                labels=apart(span, Label(span=head_span(item), message="outer loop")),
                notes=notes,
                help="effective depth multiplies: outer T × inner T × blocks",
            )


def _loops_within(ctx: Ctx, body: tuple) -> Iterator[tuple[n.Node, str | None]]:
    """Loops in a stack (not looking inside them), with the `let` name that brought them in."""
    todo = list(body)
    while todo:
        it = todo.pop()
        if isinstance(it, n.Loop):
            yield it, None
        elif isinstance(it, n.Call) and it.name in ctx.lets and lookup(it.name) is None:
            bound = ctx.binding(it)
            if bound is not None and _has_loop(ctx, bound):
                yield it, it.name
        else:
            todo += children(it)


def _has_loop(ctx: Ctx, item: n.Node, depth: int = 0) -> bool:
    if isinstance(item, n.Loop):
        return True
    if isinstance(item, n.Call) and item.name in ctx.lets and depth < len(ctx.lets):
        bound = ctx.binding(item)
        return bound is not None and _has_loop(ctx, bound, depth + 1)
    return any(_has_loop(ctx, c, depth) for c in children(item))
