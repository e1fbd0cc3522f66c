"""Names (E01xx): layer kinds, options, enum values, settings, loop options, mlp and norm kinds."""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic, error
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import all_names, lookup
from lt2dsl.ir.settings import MODEL_SETTINGS
from lt2dsl.ir.specs.channel import MLP_KINDS, NORM_KINDS
from lt2dsl.source import Span
from lt2dsl.suggest import did_you_mean
from lt2dsl.validate.context import CALL_CHOICES, LOOP_SCHEMA, OVERRIDE_ONLY, SETTINGS, Ctx
from lt2dsl.validate.rules import rule

MLP_NAMES = (*MLP_KINDS, "none")
NORM_NAMES = tuple(NORM_KINDS)


@rule("E0101")
def check_unknown_layer(ctx: Ctx) -> Iterator[Diagnostic]:
    """Unknown layer kind.

    What it checks:
        A block names something that is neither a registered layer kind (or alias) nor a `let`.

    Why it matters:
        The compiler cannot build a block it does not know; a typo would otherwise surface much
        later, or silently pick the wrong mixer.

    Example:
        dim = 1024
        loop T=4 < gdn; dsaa(topk=64) >

    Use instead:
        dim = 1024
        loop T=4 < gdn; dsa(topk=64) >
    """
    for call, _ in ctx.block_calls():
        if call.name in ctx.lets or lookup(call.name) is not None:
            continue
        notes = ()
        if call.name in MLP_KINDS or call.name in NORM_KINDS:
            what = "channel mixer" if call.name in MLP_KINDS else "norm"
            opt = "mlp" if call.name in MLP_KINDS else "norm"
            notes = (f"`{call.name}` is a {what}: set it on a block with `{opt}={call.name}`",)
        yield error(
            "E0101",
            f"unknown layer `{call.name}`",
            call.name_span,
            label="not a registered layer",
            help=did_you_mean(call.name, [*all_names(), *ctx.lets], "layer"),
            notes=notes,
        )


@rule("E0102")
def check_unknown_option(ctx: Ctx) -> Iterator[Diagnostic]:
    """Unknown option.

    What it checks:
        A call passes an option its kind does not have (`full(gat=sdpa)`, `swiglu(hiden=4096)`).

    Why it matters:
        An option the compiler ignored would be a setting the user believes in but does not get.

    Example:
        dim = 1024
        full(gat=sdpa)

    Use instead:
        dim = 1024
        full(gate=sdpa)
    """
    loop_only = {o.name for o in LOOP_SCHEMA} - {"norm"}
    for al in ctx.arglists:
        if al.owner == "loop":
            continue
        for a in al.args:
            if a.name is None or al.option(a.name) is not None:
                continue
            notes = ()
            if a.name in loop_only and al.kind is not None:
                notes = (
                    f"`{a.name}` is a loop option: write it on the loop, `loop T=n, {a.name}=... < ... >`",
                )
            yield error(
                "E0102",
                f"`{al.owner}` has no option `{a.name}`",
                a.name_span,
                label="unknown option",
                help=did_you_mean(
                    a.name,
                    [o.name for o in al.options],
                    f"option of `{al.owner}`",
                    f"options of `{al.owner}`",
                ),
                notes=notes,
            )


@rule("E0103")
def check_unknown_choice(ctx: Ctx) -> Iterator[Diagnostic]:
    """Unknown enum value.

    What it checks:
        An option that takes one of a fixed set of names (`gate`, `feature_map`, `inject`,
        `dtype`, ...) is given a name outside that set.

    Why it matters:
        Each choice selects different weights and kernels; an unknown one has no meaning.

    Example:
        dim = 1024
        full(gate=sdpaa)

    Use instead:
        dim = 1024
        full(gate=sdpa)
    """
    for site in ctx.sites():
        o, v = site.option, site.value
        if o.type != "enum":
            continue
        name = _choice_name(v)
        if name is None or name in o.choices:
            continue
        if isinstance(v, n.Call) and (o.name, name) in CALL_CHOICES:
            continue
        span = v.name_span if isinstance(v, n.Call) else v.span
        yield error(
            "E0103",
            f"unknown value `{name}` for {site.what}",
            span,
            label="not a valid choice",
            help=did_you_mean(name, o.choices, "choice"),
        )


def _choice_name(v: n.Node) -> str | None:
    if isinstance(v, n.Call):
        return v.name
    if isinstance(v, n.Name):
        return v.value
    return "none" if isinstance(v, n.NoneVal) else None


@rule("E0104")
def check_unknown_setting(ctx: Ctx) -> Iterator[Diagnostic]:
    """Unknown model setting.

    What it checks:
        A model setting (`name = value` at the top level, or `--set name=value`) that lt2dsl
        does not know.

    Why it matters:
        A misspelt setting leaves the real one at its default, which changes the model without
        any sign.

    Example:
        dim = 1024
        max_length = 32k
        gdn

    Use instead:
        dim = 1024
        max_len = 32k
        gdn
    """
    for s in ctx.program.settings:
        if s.name in SETTINGS or s.name in OVERRIDE_ONLY:
            continue
        span = setting_name_span(s)
        notes = ()
        if lookup(s.name) is not None or s.name in ctx.lets:
            notes = (f"`{s.name}` is a layer; options of a block go in parentheses: `{s.name}(...)`",)
        yield error(
            "E0104",
            f"unknown setting `{s.name}`",
            span,
            label="not a model setting",
            help=did_you_mean(s.name, [o.name for o in MODEL_SETTINGS], "setting"),
            notes=notes,
        )


def setting_name_span(s: n.Setting) -> Span:
    """Where a setting's name was written; for `--set KEY=VALUE` (a one-line source named
    `--set KEY` holding `KEY=VALUE`) the key at its start."""
    if s.name_span.known:
        return s.name_span
    if s.span.file == f"--set {s.name}":
        return Span(file=s.span.file, line=1, col=1, end_line=1, end_col=len(s.name) + 1)
    return s.span


@rule("E0105")
def check_unknown_loop_option(ctx: Ctx) -> Iterator[Diagnostic]:
    """Unknown loop option.

    What it checks:
        A `loop` passes an option other than `final_norm`, `inject`, `exit` and `norm`.

    Why it matters:
        Loop options change how iterations are chained; a misspelt one leaves the default in
        place without any sign.

    Example:
        dim = 1024
        loop T=4, finalnorm=true < gdn >

    Use instead:
        dim = 1024
        loop T=4, final_norm=true < gdn >
    """
    names = [o.name for o in LOOP_SCHEMA]
    for al in ctx.arglists:
        if al.owner != "loop":
            continue
        for a in al.args:
            if a.name is None or al.option(a.name) is not None:
                continue
            notes = ("`T` is given once, right after `loop`",) if a.name == "T" else ()
            yield error(
                "E0105",
                f"unknown loop option `{a.name}`",
                a.name_span,
                label="not a loop option",
                help=did_you_mean(a.name, names, "loop option"),
                notes=notes,
            )


def _kind_value(v: n.Node) -> tuple[str, object] | None:
    """(name, span) of a value that names a kind: `swiglu`, `swiglu(...)`, `none`."""
    if isinstance(v, n.Call):
        return v.name, v.name_span
    if isinstance(v, n.Name):
        return v.value, v.span
    if isinstance(v, n.NoneVal):
        return "none", v.span
    return None


@rule("E0106")
def check_unknown_mlp(ctx: Ctx) -> Iterator[Diagnostic]:
    """Unknown channel mixer.

    What it checks:
        An `mlp` value (on the model or a block) that is not `swiglu(...)`, `gelu(...)` or `none`.

    Why it matters:
        The channel mixer is half of every block's parameters; it has to be one lt2dsl can build.

    Example:
        dim = 1024
        mlp = swigul(hidden=4096)
        gdn

    Use instead:
        dim = 1024
        mlp = swiglu(hidden=4096)
        gdn
    """
    yield from _unknown_kind(ctx, "mlp", MLP_NAMES, "E0106", "channel mixer")


@rule("E0107")
def check_unknown_norm(ctx: Ctx) -> Iterator[Diagnostic]:
    """Unknown norm.

    What it checks:
        A `norm` value (on the model, a loop or a block) that is not `rmsnorm(...)`,
        `layernorm(...)` or `sandwich`.

    Why it matters:
        Every block applies its norm before the mixer and the MLP; an unknown norm cannot be built.

    Example:
        dim = 1024
        norm = rmsnrom(eps=1e-6)
        gdn

    Use instead:
        dim = 1024
        norm = rmsnorm(eps=1e-6)
        gdn
    """
    yield from _unknown_kind(ctx, "norm", NORM_NAMES, "E0107", "norm")


def _unknown_kind(ctx: Ctx, type_: str, names: tuple[str, ...], code: str, what: str) -> Iterator[Diagnostic]:
    for site in ctx.sites():
        if site.option.type != type_ or (kv := _kind_value(site.value)) is None:
            continue
        name, span = kv
        if name in names:
            continue
        yield error(
            code,
            f"unknown {what} `{name}` for {site.what}",
            span,
            label=f"not a {what}",
            help=did_you_mean(name, names, what),
        )
