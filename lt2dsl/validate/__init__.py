"""`validate(program)`: every rule of language.md §6, all diagnostics in one pass, in source order.

The surface rules (names, values, structure) read the program as written. When none of them
found an error, the program is resolved and the shape rules read the resolved model, pointing
back at what the user wrote; when those found no error either, the kernel rules run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from lt2dsl.diagnostics import Diagnostic, sort_diagnostics
from lt2dsl.ir import nodes as n
from lt2dsl.passes.resolve import apply_overrides, resolve
from lt2dsl.validate import kernels, names, shapes, structure, values
from lt2dsl.validate.context import Ctx, ShapeCtx
from lt2dsl.validate.rules import RULES, Rule, all_rules

SURFACE: tuple[Callable[[Ctx], Iterator[Diagnostic]], ...] = (
    names.check_unknown_layer,
    names.check_unknown_option,
    names.check_unknown_choice,
    names.check_unknown_setting,
    names.check_unknown_loop_option,
    names.check_unknown_mlp,
    names.check_unknown_norm,
    values.check_value_type,
    values.check_value_range,
    values.check_count,
    structure.check_empty_stack,
    structure.check_empty_model,
    structure.check_let_before_definition,
    structure.check_let_shadows_kind,
    structure.check_duplicate_setting,
    structure.check_duplicate_option,
    structure.check_let_recursion,
    structure.check_required_settings,
    structure.check_positional_count,
    structure.check_positional_allowed,
    structure.check_duplicate_let,
    structure.check_par_members,
    structure.check_let_use_options,
    structure.check_unused_let,
    structure.check_nested_loops,
)
SHAPES: tuple[Callable[[ShapeCtx], Iterator[Diagnostic]], ...] = (
    shapes.check_kv_heads,
    shapes.check_value_heads,
    shapes.check_derived_head_dim,
    shapes.check_mamba2_width,
    shapes.check_tmm_heads,
    shapes.check_tmm_max_len,
    shapes.check_nsa_stride,
    shapes.check_model_head_dim,
    shapes.check_window_fits,
    shapes.check_topk_fits,
)
# Kernel warnings read resolved widths, which mean something only once the shapes are right.
KERNELS: tuple[Callable[[ShapeCtx], Iterator[Diagnostic]], ...] = (
    kernels.check_delta_head_dim,
    kernels.check_kernel_note,
)

__all__ = ["KERNELS", "RULES", "SHAPES", "SURFACE", "Rule", "all_rules", "check", "validate"]


def validate(program: n.Program, overrides: dict[str, n.Node] | None = None) -> list[Diagnostic]:
    """Every diagnostic for `program` with `--set` `overrides`, sorted by position."""
    return check(program, overrides)[0]


def check(
    program: n.Program, overrides: dict[str, n.Node] | None = None
) -> tuple[list[Diagnostic], n.Model | None]:
    """(diagnostics, resolved model) — the model is None when there is an error."""
    overrides = dict(overrides or {})
    applied = apply_overrides(program, _applicable(overrides))
    ctx = Ctx(applied, overrides)
    diags = [d for r in SURFACE for d in r(ctx)]
    if any(d.is_error for d in diags):
        return sort_diagnostics(diags), None
    model = resolve(program, _applicable(overrides))
    shape_ctx = ShapeCtx(ctx, model)
    diags += [d for r in SHAPES for d in r(shape_ctx)]
    if not any(d.is_error for d in diags):
        diags += [d for r in KERNELS for d in r(shape_ctx)]
    diags = sort_diagnostics(diags)
    return diags, None if any(d.is_error for d in diags) else model


def _applicable(overrides: dict[str, n.Node]) -> dict[str, n.Node]:
    """Overrides the resolve pass can apply: a `loop.T` that is not a positive integer is left
    out (it is reported by `check_count`)."""
    out = dict(overrides)
    for key in ("loop.T", "loop_T"):
        v = out.get(key)
        if v is not None and not (isinstance(v, n.Int) and v.value >= 1):
            del out[key]
    return out
