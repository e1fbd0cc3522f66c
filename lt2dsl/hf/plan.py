"""What an importer makes of a checkpoint's config: the `.lt2` program and where each weight goes.

A family reader (`families.py`, `fla.py`) turns a config into a `Plan`: model settings, one `Layer`
per stored layer (its `.lt2` call and the prefixes of its weights), an optional loop around them,
and the model-level weight map. The block-level maps are data with a `{}` slot for the layer
index (torchtitan's `from_hf_map` shape); each mixer's own names come from its `LayerSpec.hf_map`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lt2dsl.ir.printer import floating


@dataclass(frozen=True)
class Layer:
    """One stored layer → one `.lt2` block.

    Args:
        role (str): the `let` name its call is bound to (`attn`, `local`, `gdn`, ...).
        call (str): its `.lt2` call, e.g. `full(rope_theta=500000.0)`.
        kind (str): the layer kind of the call (`full`, `swa`, `gdn`, ...).
        block_map (dict): HF key with a `{}` slot → native key within the block (`norms.0.weight`).
        mixer (str): the HF prefix of the mixer's weights within the layer (`model.layers.{}.self_attn.`).
    """

    role: str
    call: str
    kind: str
    block_map: dict[str, str]
    mixer: str


@dataclass(frozen=True)
class Plan:
    """A checkpoint as a `.lt2` program plus the weight maps (see the module docstring)."""

    family: str
    name: str
    settings: dict[str, str]
    layers: list[Layer]
    model_map: dict[str, str | None]
    loop: str | None = None  # e.g. `loop T=4, final_norm=true` around all layers
    notes: list[str] = field(default_factory=list)


def num(x: float | int) -> str:
    """A number as `.lt2` text: integers stay integers, floats in the printer's exact form."""
    if isinstance(x, bool):
        raise TypeError("a boolean is not a number")
    return str(x) if isinstance(x, int) else floating(float(x))


def call(kind: str, opts: dict[str, str]) -> str:
    """`kind(a=1, b=2)` (bare `kind` without options)."""
    inner = ", ".join(f"{k}={v}" for k, v in opts.items())
    return f"{kind}({inner})" if inner else kind


def lt2_text(plan: Plan, source: str) -> str:
    """The program (before the canonical printer): a header comment, settings, one `let` per role,
    then the layers in order with runs of one role written `role * n`."""
    lines = [f"# Imported from {source} ({plan.family}) by `lt2dsl import`."]
    lines += [f"# {note}" for note in plan.notes]
    lines.append(f"model {plan.name} {{")
    lines += [f"  {k} = {v}" for k, v in plan.settings.items()]
    seen: dict[str, str] = {}
    for layer in plan.layers:
        if layer.role in seen and seen[layer.role] != layer.call:
            raise AssertionError(f"internal error in `lt2dsl import`: role {layer.role} has two calls")
        seen.setdefault(layer.role, layer.call)
    lines += [f"  let {role} = {c}" for role, c in seen.items()]
    body = [f"{role} * {n}" if n > 1 else role for role, n in runs([layer.role for layer in plan.layers])]
    if plan.loop:
        lines += [f"  {plan.loop} <", *(f"    {b}" for b in body), "  >"]
    else:
        lines += [f"  {b}" for b in body]
    lines.append("}")
    return "\n".join(lines) + "\n"


def runs(roles: list[str]) -> list[tuple[str, int]]:
    """Consecutive equal roles as (role, count): `[a, a, b]` → `[(a, 2), (b, 1)]`."""
    out: list[tuple[str, int]] = []
    for r in roles:
        if out and out[-1][0] == r:
            out[-1] = (r, out[-1][1] + 1)
        else:
            out.append((r, 1))
    return out
