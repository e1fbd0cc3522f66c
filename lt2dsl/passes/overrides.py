"""`overrides`: the settings given with `--set` (or `lt2dsl.compile(..., dim=256)`), in one place.

An override replaces (or adds) a model setting; `loop.T` (also spelt `loop_T`, a valid Python
keyword) sets the T of every loop. Text values are parsed with the `.lt2` value syntax, so they
mean what they would mean in the file. A resolved `Model` takes only `loop.T`: its settings are
already folded into every block.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from lt2dsl.diagnostics import Diagnostic, error
from lt2dsl.grammar.parse import parse_value
from lt2dsl.ir import nodes as n
from lt2dsl.ir.settings import LOOP_T_KEYS
from lt2dsl.passes.values import py
from lt2dsl.source import SourceFile, Span
from lt2dsl.validate.rules import rule

NAME = "overrides"


# ---- values ----------------------------------------------------------------------------------


def parse_overrides(
    overrides: Mapping[str, str | n.Node], sources: dict[str, SourceFile]
) -> tuple[dict[str, n.Node], list[Diagnostic]]:
    """`--set` overrides as value nodes; a text value is parsed with the `.lt2` value syntax and
    registered as a one-line source `--set KEY` so its diagnostics can quote it."""
    values: dict[str, n.Node] = {}
    diags: list[Diagnostic] = []
    for key, raw in overrides.items():
        if isinstance(raw, n.Node):
            values[key] = raw
            continue
        src = SourceFile(name=f"--set {key}", text=f"{key}={raw}")
        sources[src.name] = src
        problems = list(check_override_value(key, str(raw), src.name))
        if problems:
            diags += problems
        else:
            values[key] = parse_value(str(raw), src.name, col=len(key) + 2)
    return values, diags


@rule("E0902")
def check_override_value(key: str, raw: str, file: str) -> Iterator[Diagnostic]:
    """Invalid `--set` value.

    What it checks:
        The value of `--set key=value` is one `.lt2` value: a number (`1024`, `32k`, `8/3`,
        `1e-6`), `true`/`false`, `none`, a string, a name or a call (`swiglu(hidden=8k)`).

    Why it matters:
        Overrides use the same value syntax as the file, so they mean the same thing.

    Example:
        lt2dsl check model.lt2 --set dim=1k2

    Use instead:
        lt2dsl check model.lt2 --set dim=1024
    """
    try:
        parse_value(raw, file, col=len(key) + 2)
    except ValueError as e:
        col = len(key) + 2
        span = Span(file=file, line=1, col=col, end_line=1, end_col=col + max(len(raw), 1))
        yield error(
            "E0902",
            f"invalid value for `--set {key}`",
            span,
            label=str(e).split(": ", 1)[-1],
            help="values are written as in a `.lt2` file: `1024`, `32k`, `true`, `sdpa`, `swiglu(hidden=8k)`",
        )


@rule("E0904")
def check_loop_override(program: n.Program, overrides: Mapping[str, n.Node]) -> Iterator[Diagnostic]:
    """Loop count override on a model without a loop.

    What it checks:
        `--set loop.T=n` (or `compile(..., loop_T=n)`) is given for a program that has no
        `loop` (in its body or in a `let`).

    Why it matters:
        The override sets the iteration count of every loop; with no loop it would change
        nothing, and the model compiled is not the one asked for.

    Example:
        lt2dsl compile model.lt2 --set loop.T=8   # model.lt2: `dim = 1024` and `gdn`

    Use instead:
        lt2dsl compile model.lt2   # or write the blocks inside `loop T=8 < ... >`
    """
    key = next((k for k in LOOP_T_KEYS if k in overrides), None)
    if key is None or has_loop([*program.body, *(let.item for let in program.lets)]):
        return
    v = overrides[key]
    span = Span(file=v.span.file, line=1, col=1, end_line=1, end_col=len(key) + 1) if v.span.known else v.span
    yield error(
        "E0904",
        f"`{key}` is set but the model has no loop",
        span,
        label="no loop to set",
        help="drop the override, or put the blocks inside `loop T=n < ... >`",
    )


def has_loop(items: list[n.Node]) -> bool:
    """Whether a loop is among `items` or inside them (surface items or resolved stages)."""
    todo = list(items)
    while todo:
        item = todo.pop()
        if isinstance(item, n.Loop | n.LoopBlock):
            return True
        if isinstance(item, n.Repeat):
            todo += item.body
        elif isinstance(item, n.Times):
            todo.append(item.item)
    return False


def as_node(v: Any, parse: bool = False) -> Any:
    """A Python override value as an IR value node. Text is parsed only with `parse` (raising
    ValueError); otherwise it stays text for `parse_overrides`, which reports it as a diagnostic."""
    if isinstance(v, n.Node):
        return v
    if isinstance(v, bool):
        return n.Bool(value=v)
    if isinstance(v, int):
        return n.Int(value=v)
    if isinstance(v, float):
        return n.Float(value=v)
    if isinstance(v, str):
        return parse_value(v) if parse else v
    raise ValueError(f"override values must be numbers, booleans or strings, got {type(v).__name__}")


# ---- applying them -----------------------------------------------------------------------------


def applicable(overrides: Mapping[str, n.Node]) -> dict[str, n.Node]:
    """The overrides `apply_overrides` can apply: a `loop.T` that is not a positive integer is
    left out (validation reports it)."""
    out = dict(overrides)
    for key in LOOP_T_KEYS:
        v = out.get(key)
        if v is not None and not (isinstance(v, n.Int) and v.value >= 1):
            del out[key]
    return out


def apply_overrides(prog: n.Program, overrides: Mapping[str, n.Node]) -> n.Program:
    """Settings given with --set replace (or add) model settings; `loop.T` sets every loop's T."""
    rest = dict(overrides)
    T = next((rest.pop(k) for k in LOOP_T_KEYS if k in rest), None)
    if rest:
        kept = [s for s in prog.settings if s.name not in rest]
        added = [n.Setting(name=k, value=v, span=v.span) for k, v in rest.items()]
        prog = prog.model_copy(update={"settings": tuple(kept + added)})
    if T is None:
        return prog
    t = int(py(T))
    return prog.model_copy(
        update={
            "body": tuple(set_loop_T(i, t) for i in prog.body),
            "lets": tuple(let.model_copy(update={"item": set_loop_T(let.item, t)}) for let in prog.lets),
        }
    )


def override_model(model: n.Model, overrides: Mapping[str, Any]) -> n.Model:
    """A resolved model with `loop.T` applied; any other setting needs the source (ValueError)."""
    rest = dict(overrides)
    T = next((rest.pop(k) for k in LOOP_T_KEYS if k in rest), None)
    if rest:
        raise ValueError(
            f"a resolved Model accepts only the loop_T override, got {sorted(rest)}; "
            "pass the .lt2 source to override settings"
        )
    if T is None:
        return model
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"loop_T must be a positive integer, got {T!r}")
    if not has_loop(list(model.body)):
        raise ValueError("loop_T is set but the model has no loop [E0904]")
    return model.model_copy(update={"body": tuple(set_loop_T(s, T) for s in model.body)})


def set_loop_T(item: n.Node, T: int) -> n.Node:
    """`item` with every loop in it running T times: surface items (`Loop`, `Repeat`, `Times`)
    and resolved stages (`LoopBlock`) alike."""
    match item:
        case n.Loop() | n.LoopBlock():
            return item.model_copy(update={"T": T, "body": tuple(set_loop_T(i, T) for i in item.body)})
        case n.Repeat():
            return item.model_copy(update={"body": tuple(set_loop_T(i, T) for i in item.body)})
        case n.Times():
            return item.model_copy(update={"item": set_loop_T(item.item, T)})
        case _:
            return item
