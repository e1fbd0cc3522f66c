"""Which kernel forms one delta-rule call runs: a frozen `DeltaRecipe`, chosen by `default_recipe`.

The recipe is passed from the public op down to every launch; no environment variable decides a
kernel form. `default_recipe` is a pure function of the rule, the sizes, the dtype and the device:

* `fused_scan`: the forward's state scan forms the output itself, with the state held transposed
  (`scan.delta_hot_fwd_kernel`), rather than the split form (a state scan that stores the chunk
  states, then a chunk-parallel output kernel). The fused scan runs one program per (64-wide value
  tile, sequence x head) and carries the output's dots on its sequential path, so with a scalar
  gate it gives way to the split form when those programs are fewer than half the SMs (GDN at
  B=1, T=32768, H=16 on the H200: forward 2.101 ms split against 2.813 fused; BENCHMARKS.md,
  "Delta rule"). DeltaNet's gate-free scan is ahead fused at every shape timed, and KDA's
  per-channel gate has only the split form.
* `grad_bk`: the key tile of the per-(K tile, chunk) gradient kernel, 64 for 16-bit inputs with a
  scalar gate or none, 32 for fp32 inputs (at 64 their tf32x3 dots spill) and for KDA.
* `kda_diag_span`: the largest decay over a 16-token sub-chunk for which KDA forms the diagonal
  block as a dot (`tl_util.DIAG_SPAN`); above it the block is formed elementwise. Tests move it to
  force either form.

`RECIPES` names recipes for benches and tests: each is the default with some fields set.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import triton

from lt2dsl.kernels.common.tl_util import DIAG_SPAN

GATES = ("none", "scalar", "channel")
GRAD_TILES = (32, 64)
# the fused scan's value tile: one program per 64 value columns of a (sequence, value head)
FUSED_BV = 64
# the fraction of the SMs the gated fused scan's programs must fill to beat the split form
FUSED_MIN_SM_FRACTION = 0.5


@dataclass(frozen=True)
class DeltaRecipe:
    """The kernel forms of one delta-rule call (module docstring)."""

    fused_scan: bool = True
    grad_bk: int = 64
    kda_diag_span: float = DIAG_SPAN

    def __post_init__(self):
        if self.grad_bk not in GRAD_TILES:
            raise ValueError(f"grad_bk must be one of {GRAD_TILES}, got {self.grad_bk}")

    def check(self, gate: str) -> DeltaRecipe:
        """This recipe, if the kernels have its forms for `gate`; else a ValueError."""
        if gate == "channel" and self.fused_scan:
            raise ValueError("KDA's per-channel gate has no fused scan: use fused_scan=False")
        if gate == "channel" and self.grad_bk != 32:
            raise ValueError(f"KDA's gradient kernel runs the 32-wide key tile, got grad_bk={self.grad_bk}")
        return self


@dataclass(frozen=True)
class DeltaShape:
    """What the recipe depends on: the rule's gate, N sequences, HV value heads, head dims K, V."""

    gate: str
    N: int
    HV: int
    K: int
    V: int


def default_recipe(shape: DeltaShape, dtype: torch.dtype, device_props: Any = None) -> DeltaRecipe:
    """The recipe for `shape` and inputs of `dtype` on a device with `device_props` (as
    `torch.cuda.get_device_properties` returns; None for the CPU interpreter)."""
    if shape.gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {shape.gate!r}")
    sms = getattr(device_props, "multi_processor_count", None)
    if shape.gate == "channel":
        fused = False
    elif shape.gate == "scalar" and sms is not None:
        programs = shape.N * shape.HV * triton.cdiv(shape.V, FUSED_BV)
        fused = programs >= FUSED_MIN_SM_FRACTION * sms
    else:
        fused = True
    wide = dtype in (torch.bfloat16, torch.float16) and shape.gate != "channel"
    return DeltaRecipe(fused_scan=fused, grad_bk=64 if wide else 32)


# Named recipes: the default with these fields set.
RECIPES: dict[str, dict[str, Any]] = {
    "default": {},
    "fused": {"fused_scan": True},
    "split": {"fused_scan": False},
}


def named_recipe(name: str, shape: DeltaShape, dtype: torch.dtype, device_props: Any = None) -> DeltaRecipe:
    """`RECIPES[name]` for this call: the default recipe with the named fields set."""
    if name not in RECIPES:
        raise ValueError(f"unknown delta recipe {name!r}; known: {', '.join(RECIPES)}")
    return replace(default_recipe(shape, dtype, device_props), **RECIPES[name])


def every_recipe(gate: str) -> list[DeltaRecipe]:
    """Every recipe the kernels have forms for with `gate` (the compile check builds them all)."""
    out = []
    for fused in (True, False):
        for bk in GRAD_TILES:
            recipe = DeltaRecipe(fused_scan=fused, grad_bk=bk)
            try:
                out.append(recipe.check(gate))
            except ValueError:
                continue
    return out


def check_recipe_arg(recipe) -> None:
    """A TypeError or ValueError unless `recipe` is None, a `DeltaRecipe` or a name of RECIPES."""
    if isinstance(recipe, str) and recipe not in RECIPES:
        raise ValueError(f"unknown delta recipe {recipe!r}; known: {', '.join(RECIPES)}")
    if recipe is not None and not isinstance(recipe, str | DeltaRecipe):
        kind = type(recipe).__name__
        raise TypeError(f"recipe must be a DeltaRecipe, a name of RECIPES or None, got {kind}")


def resolve_recipe(recipe, shape: DeltaShape, dtype: torch.dtype, device: torch.device) -> DeltaRecipe:
    """The `DeltaRecipe` of one call: `recipe` itself, `RECIPES[recipe]` for a name, or the default
    for None; a ValueError when the kernels have no such forms for the rule."""
    check_recipe_arg(recipe)
    if recipe is None or isinstance(recipe, str):
        props = torch.cuda.get_device_properties(device) if device.type == "cuda" else None
        recipe = named_recipe(recipe or "default", shape, dtype, props)
    return recipe.check(shape.gate)
