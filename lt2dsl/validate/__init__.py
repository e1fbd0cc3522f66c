"""The rules of language.md §6: every diagnostic of a program, in source order.

`check` runs the surface rules (names, values, structure), which read the program as written
(with its `--set` overrides applied). `check_resolved` runs the shape rules, which read the
resolved model and point back at what the user wrote, and, when those find no error, the kernel
rules. Neither resolves anything: the front end (`lt2dsl.frontend`) runs them between its passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from lt2dsl.diagnostics import Diagnostic, sort_diagnostics
from lt2dsl.ir import nodes as n
from lt2dsl.validate import kernels, limits, names, rope, shapes, structure, tmm, values
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
    limits.check_value_limit,
    limits.check_applied_depth,
    limits.check_let_nesting,
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
    tmm.check_tmm_kernel,
    shapes.check_nsa_stride,
    shapes.check_model_head_dim,
    shapes.check_rope_head_dim,
    shapes.check_mamba2_groups,
    shapes.check_linear_normalizer,
    shapes.check_window_fits,
    shapes.check_topk_fits,
    rope.check_rope_dim,
    rope.check_rope_freq_factors,
)
# Kernel warnings read resolved widths, which mean something only once the shapes are right.
KERNELS: tuple[Callable[[ShapeCtx], Iterator[Diagnostic]], ...] = (
    kernels.check_delta_head_dim,
    kernels.check_kernel_note,
)

__all__ = ["KERNELS", "RULES", "SHAPES", "SURFACE", "Rule", "all_rules", "check", "check_resolved"]


def check(program: n.Program, overrides: Mapping[str, n.Node] | None = None) -> list[Diagnostic]:
    """The surface rules' diagnostics, sorted. `program` has its `--set` overrides applied;
    `overrides` are the values as given (the rules check them too)."""
    ctx = Ctx(program, dict(overrides or {}))
    return sort_diagnostics(d for r in SURFACE for d in r(ctx))


def check_resolved(
    program: n.Program, model: n.Model, overrides: Mapping[str, n.Node] | None = None
) -> list[Diagnostic]:
    """The shape rules' diagnostics for `model` (the resolved `program`), then, when they found no
    error, the kernel rules', sorted."""
    shape_ctx = ShapeCtx(Ctx(program, dict(overrides or {})), model)
    diags = [d for r in SHAPES for d in r(shape_ctx)]
    if not any(d.is_error for d in diags):
        diags += [d for r in KERNELS for d in r(shape_ctx)]
    return sort_diagnostics(diags)
