"""Recipes of the blocked Toeplitz product (`blocked.py`): where pass 2 reads its Toeplitz tiles, and
how a kept kernel is launched.

A recipe is data, passed from the op (`lt2dsl::toeplitz_blocked` takes its name) down to the
launchers (`blocked.blocked_fwd` / `blocked_bwd` take the `ToeplitzRecipe`). `default_recipe` picks
it from the call's shape; a benchmark names one of `RECIPES`; a test passes any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# blocks per tile of pass 2 (its dots are [2·TILE, 2·TILE] × [2·TILE, BC]). 32, not 64: the
# diagonal tiles, half zeros, are a smaller share and each program runs more pipelined steps
# (pass 2 120 µs against 142 at B=1, T=32768, C=1024; BENCHMARKS.md "Tried and dropped")
TILE = 32
# the precomputed tiles of pass 2 are used while they take at most this much memory
TILE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class ToeplitzRecipe:
    """How the blocked product runs.

    Args:
        pass2 (str): "tiles" — pass 2 reads Toeplitz tiles precomputed from the kernel spectra
            (`tiles_kernel`, cached while w is unchanged); "gather" — it gathers them from the
            packed spectra in its loop (`mix_kernel`), for kernels whose tiles would take more than
            `TILE_BYTES`. Default: "tiles".
        launch (str): how a kept compiled kernel is launched (`launch.py`): "static" (torch's C++
            static launcher, falling back to "runner" where it does not take the kernel), "runner"
            (the CompiledKernel's own launcher) or "triton" (Triton's full launch path every call:
            the CPU interpreter's, and a Triton without kept kernels). Default: "static".
    """

    pass2: Literal["tiles", "gather"] = "tiles"
    launch: Literal["static", "runner", "triton"] = "static"

    def __post_init__(self):
        if self.pass2 not in ("tiles", "gather"):
            raise ValueError(f"ToeplitzRecipe.pass2 must be 'tiles' or 'gather', got {self.pass2!r}")
        if self.launch not in ("static", "runner", "triton"):
            raise ValueError(f"ToeplitzRecipe.launch must be static, runner or triton, got {self.launch!r}")


RECIPES: dict[str, ToeplitzRecipe] = {"tiles": ToeplitzRecipe(), "gather": ToeplitzRecipe(pass2="gather")}


def tile_bytes(heads: int, S: int, M: int) -> int:
    """Bytes of the precomputed pass-2 tiles (bf16) of `heads` kernels, S bins, M blocks."""
    return heads * S * -(-M // TILE) * (2 * TILE) ** 2 * 2


def default_recipe(heads: int, T: int, S: int) -> ToeplitzRecipe:
    """The recipe of a call: the precomputed tiles while they fit `TILE_BYTES`, else gathered."""
    return RECIPES["tiles" if tile_bytes(heads, S, -(-T // S)) <= TILE_BYTES else "gather"]


def pick(name: str, heads: int, T: int, S: int) -> ToeplitzRecipe:
    """The recipe `name` of `RECIPES` ("" for `default_recipe`); a ValueError names the known ones."""
    if not name:
        return default_recipe(heads, T, S)
    if name not in RECIPES:
        raise ValueError(f"unknown Toeplitz recipe {name!r}; known: {', '.join(RECIPES)}")
    return RECIPES[name]
