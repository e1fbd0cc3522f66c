"""Limits (E0204-E0206): values, depth and nesting past what lt2dsl lowers (`lt2dsl/ir/limits.py`).

These surface rules read the program as written, without expanding it: `repeat 1000000 < gdn >`
or 63 nested loops are measured by multiplying counts, never by building the blocks, and `let`
chains are measured once per binding.
"""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic, error
from lt2dsl.grammar.parse import MAX_DEPTH
from lt2dsl.ir import nodes as n
from lt2dsl.ir.limits import MAX_APPLIED, depth_problem, max_value
from lt2dsl.ir.registry import lookup
from lt2dsl.validate.context import Ctx
from lt2dsl.validate.rules import rule
from lt2dsl.validate.values import describe


@rule("E0204")
def check_value_limit(ctx: Ctx) -> Iterator[Diagnostic]:
    """Value above lt2dsl's limit.

    What it checks:
        Integer options and settings stay within lt2dsl's limits: widths and counts (`dim`,
        `heads`, `head_dim`, `state`, …) at most 65,536, lengths and sizes (`max_len`,
        `window`, `topk`, `hidden`, …) at most 16,777,216 (16M), `vocab` at most 16M.

    Why it matters:
        No model comes near these limits; a value past them is a typo (an extra digit, a
        `k` for an `M`), and would build tensors whose sizes overflow.

    Example:
        dim = 1000000000000000000000000000000
        gdn

    Use instead:
        dim = 4096
        gdn
    """
    for site in ctx.sites():
        limit = max_value(site.option)
        if limit is None or not isinstance(site.value, n.Int) or site.value.value <= limit:
            continue
        yield error(
            "E0204",
            f"{site.what} is {describe(site.value)}, above lt2dsl's limit",
            site.value.span,
            label="too large",
            help=f"lt2dsl accepts `{site.option.name}` up to {limit:,}",
        )


def measure(item: n.Node, lets: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(nesting depth, block applications) of one item, `let` uses looked up in `lets`.

    Items nest at most MAX_DEPTH levels (the parser refuses deeper), so this recursion is
    shallow; a `let` is measured once, where it is defined.
    """
    match item:
        case n.Call() if item.name in lets and lookup(item.name) is None:
            depth, applied = lets[item.name]
            return depth + 1, applied
        case n.Loop():
            depth, applied = measure_stack(item.body, lets)
            return depth + 1, item.T * applied
        case n.Repeat():
            depth, applied = measure_stack(item.body, lets)
            return depth + 1, item.n * applied
        case n.Times():
            depth, applied = measure(item.item, lets)
            return depth + 1, item.n * applied
    return 0, 1  # a call or a `par`: one block


def measure_stack(items: tuple[n.Node, ...], lets: dict[str, tuple[int, int]]) -> tuple[int, int]:
    measured = [measure(i, lets) for i in items]
    return max((d for d, _ in measured), default=0), sum(a for _, a in measured)


def let_measures(ctx: Ctx) -> dict[str, tuple[int, int]]:
    """(depth, applications) of every `let`, in order of definition: a use of a `let` that is
    not defined yet counts as one block (E0303 reports it), so recursion cannot loop here."""
    out: dict[str, tuple[int, int]] = {}
    for let in ctx.program.lets:
        if let.name not in out:
            out[let.name] = measure(let.item, out)
    return out


@rule("E0205")
def check_applied_depth(ctx: Ctx) -> Iterator[Diagnostic]:
    """Too many block applications.

    What it checks:
        The effective depth — blocks × loop iterations × copies, summed over the model — is
        at most 2,048.

    Why it matters:
        The lowering unrolls every iteration into the traced graph: 10^30 iterations would
        never finish tracing, and a model deeper than 2,048 applications is a typo in a count
        (published looped models apply a few hundred blocks at most).

    Example:
        dim = 1024
        loop T=100000 < gdn >

    Use instead:
        dim = 1024
        loop T=16 < gdn >
    """
    lets = let_measures(ctx)
    total = 0
    for item in ctx.program.body:
        total += measure(item, lets)[1]
        if (message := depth_problem(total)) is None:
            continue
        yield error(
            "E0205",
            message,
            _count_span(item),
            label="the applications pass the limit here",
            help=f"lt2dsl lowers models of at most {MAX_APPLIED:,} block applications; "
            "lower a loop count or a number of copies",
        )
        return


def _count_span(item: n.Node):
    match item:
        case n.Loop() if item.T_span.known:
            return item.T_span
        case n.Repeat() | n.Times() if item.n_span.known:
            return item.n_span
    return item.span


@rule("E0206")
def check_let_nesting(ctx: Ctx) -> Iterator[Diagnostic]:
    """Nesting through `let`s too deep.

    What it checks:
        Loops, repeats, copies and `let` uses nest at most 64 levels deep once every `let` is
        replaced by what it binds (a chain `let b = a`, `let c = b`, … counts one level a link).

    Why it matters:
        Every later stage walks the expanded program; a chain thousands of links long would
        exhaust the stack. No model needs more than a few levels.

    Example:
        dim = 1024
        let a0 = gdn
        let a1 = a0
        let a2 = a1  # … and so on, to `let a65 = a64`
        a65

    Use instead:
        dim = 1024
        let a0 = gdn
        a0
    """
    lets = let_measures(ctx)
    named = [(lets.get(let.name, (0, 0))[0], let.name_span, f"`{let.name}`") for let in ctx.program.lets]
    used = [(measure(i, lets)[0], i.span, "this item") for i in ctx.program.body]
    for depth, span, what in named + used:
        if depth > MAX_DEPTH:
            yield error(
                "E0206",
                f"{what} nests {depth} levels deep through `let`s, more than {MAX_DEPTH}",
                span,
                label="too deeply nested",
                help="bind the layer once and use it directly, or flatten the chain of `let`s",
            )
            return
