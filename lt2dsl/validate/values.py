"""Values (E02xx): each value has its option's type and lies in its range; counts are positive."""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic, error
from lt2dsl.ir import nodes as n
from lt2dsl.ir.printer import value as show
from lt2dsl.ir.settings import MODEL_SETTINGS
from lt2dsl.ir.spec import Option
from lt2dsl.suggest import nearby
from lt2dsl.validate.context import CALL_CHOICES, OVERRIDE_ONLY, Ctx, Site
from lt2dsl.validate.rules import rule

NUMBERS = (n.Int, n.Float, n.Frac)
# Which value nodes each option type takes. A size (`32k`) is an integer; a fraction (`8/3`) is
# a number. Enum, mlp and norm values are names or calls; their names are checked in names.py.
ACCEPTS: dict[str, tuple[type, ...]] = {
    "int": (n.Int,),
    "size": (n.Int,),
    "float": NUMBERS,
    "number": NUMBERS,
    "bool": (n.Bool,),
    "str": (n.Str,),
    "enum": (n.Name, n.NoneVal, n.Call),
    "mlp": (n.Name, n.Call, n.NoneVal),
    "norm": (n.Name, n.Call, n.NoneVal),  # `norm=none` is an unknown norm (E0107), not a type error
}
WANTS = {
    "int": "an integer",
    "size": "an integer",
    "float": "a number",
    "number": "a number",
    "bool": "`true` or `false`",
    "str": "a string",
    "mlp": "a channel mixer (`swiglu(...)`, `gelu(...)` or `none`)",
    "norm": "a norm (`rmsnorm(...)`, `layernorm(...)` or `sandwich`)",
}


def describe(v: n.Node) -> str:
    text = show(v)
    return f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`"


def wants(o: Option) -> str:
    if o.type == "enum":
        return "one of " + ", ".join(f"`{c}`" for c in o.choices)
    return WANTS.get(o.type, o.type)


@rule("E0201")
def check_value_type(ctx: Ctx) -> Iterator[Diagnostic]:
    """Wrong value type.

    What it checks:
        A value of the wrong kind for its option: a float where an integer is needed
        (`topk=1.5`), a number for a flag (`qk_norm=1`), a name where a string is needed
        (`name=block1`), a call or a string for a choice (`gate=sdpa()`, `gate="sdpa"`).

    Why it matters:
        Sizes are counted in whole units and flags are booleans; guessing a conversion would
        build a different model from the one written.

    Example:
        dim = 1024
        dsa(topk=1.5)

    Use instead:
        dim = 1024
        dsa(topk=2k)
    """
    for site in ctx.sites():
        if (d := _type_problem(site)) is not None:
            yield d


def _type_problem(site: Site) -> Diagnostic | None:
    o, v = site.option, site.value
    ok = isinstance(v, ACCEPTS.get(o.type, ()))
    if ok and o.type == "enum" and isinstance(v, n.Call) and v.name in o.choices:
        ok = (o.name, v.name) in CALL_CHOICES
        if not ok:
            return error(
                "E0201",
                f"{site.what} takes a plain name, found a call",
                v.span,
                label="not a call",
                help=f"write `{v.name}` without parentheses",
            )
    if ok:
        return None
    help_ = f"{site.what} takes {o.range_text() if o.type not in ('enum', 'mlp', 'norm') else wants(o)}"
    if o.type == "enum" and isinstance(v, n.Str):
        help_ = f"choices are names: write `{v.value}` without quotes" if v.value in o.choices else help_
    if o.type in ("int", "size") and isinstance(v, n.Float | n.Frac):
        help_ += "; sizes can be written `32k` (= 32768) or `1M`"
    if (alt := _sibling_taking(site, v)) is not None:
        help_ = f"did you mean `{alt}`? " + help_
    return error(
        "E0201",
        f"{site.what} expects {wants(o)}, found {describe(v)}",
        v.span,
        label=f"expected {wants(o)}",
        help=help_,
    )


def _sibling_taking(site: Site, v: n.Node) -> str | None:
    """For a model setting given a value of the wrong type (`head = 4`), a setting with a
    close name that takes that value (`heads`)."""
    if not site.what.startswith("setting "):
        return None
    name = site.option.name
    takes = [o.name for o in MODEL_SETTINGS if isinstance(v, ACCEPTS.get(o.type, ())) and o.name != name]
    close = nearby(name, takes)
    return close[0] if close else None


@rule("E0202")
def check_value_range(ctx: Ctx) -> Iterator[Diagnostic]:
    """Value out of range.

    What it checks:
        A number outside its option's valid range: `window=-1`, `heads=0`, `expand_k=0`,
        `eps=0`, `threshold=1.5`. The message gives the range.

    Why it matters:
        Out-of-range values give empty tensors, divisions by zero or decays that blow up;
        they are errors in the description, not choices.

    Example:
        dim = 1024
        swa(window=-1)

    Use instead:
        dim = 1024
        swa(window=512)
    """
    for site in ctx.sites():
        o, v = site.option, site.value
        if not isinstance(v, NUMBERS) or not isinstance(v, ACCEPTS.get(o.type, ())):
            continue
        if o.in_range(float(v.value)):
            continue
        yield error(
            "E0202",
            f"{site.what} must be {o.range_text()}, found {describe(v)}",
            v.span,
            label="out of range",
            help=f"choose a value that is {o.range_text()}",
        )


@rule("E0203")
def check_count(ctx: Ctx) -> Iterator[Diagnostic]:
    """Count below one.

    What it checks:
        A loop count `T=0`, a `repeat 0` or a copy `gdn * 0` (counts must be at least 1).

    Why it matters:
        A stack applied zero times is a stack that is not there; that is almost always a typo,
        and removing the stack says it plainly.

    Example:
        dim = 1024
        loop T=0 < gdn >

    Use instead:
        dim = 1024
        loop T=1 < gdn >
    """
    for item, _ in ctx.items:
        match item:
            case n.Loop():
                count, span, what = item.T, item.T_span, "loop count `T`"
            case n.Repeat() | n.Times():
                count, span, what = item.n, item.n_span, "copy count"
            case _:
                continue
        if count < 1:
            where = span if span.known else item.span
            yield error(
                "E0203",
                f"{what} must be at least 1, found `{count}`",
                where,
                label="must be at least 1",
                help="remove the stack if it should not be there",
            )
    yield from check_override_count(ctx.overrides)


def check_override_count(overrides: dict[str, n.Node]) -> Iterator[Diagnostic]:
    """`--set loop.T=...` must be an integer of at least 1 (part of E0201/E0203)."""
    for key in OVERRIDE_ONLY:
        if (v := overrides.get(key)) is None:
            continue
        if not isinstance(v, n.Int):
            yield error(
                "E0201",
                f"`--set {key}` expects an integer, found {describe(v)}",
                v.span,
                label="expected an integer",
                help="loop counts are whole numbers",
            )
        elif v.value < 1:
            yield error(
                "E0203",
                f"loop count `T` must be at least 1, found `{v.value}`",
                v.span,
                label="must be at least 1",
            )
