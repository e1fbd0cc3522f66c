"""Recipes of the softmax-attention backward: how dQ is formed, and the bound on its dS buffer.

A recipe is data, passed from the op (`lt2dsl::attn_fwd` / `attn_bwd` take its name) down to the
launchers (`triton_bwd.attn_bwd` takes the `AttnRecipe`). `default_recipe` picks it from the call's
shape; a benchmark names one of `RECIPES`; a test passes any `AttnRecipe` to the launchers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class AttnRecipe:
    """How the attention backward forms dQ.

    Args:
        dq (str): "ds" — the dK/dV kernel also writes each dsᵀ tile (rounded to the input dtype, as
            its own dK dot uses it) to a key-major dS, and dQ = dS K is one dot per tile; "split" —
            FlashAttention-2's dQ kernel recomputes p and dp (three dots per tile). "ds" needs
            fixed-length batches with plain causal or full keys (`ds_applies`). Default: "ds".
        ds_bytes (int): the dS buffer's bound, at most a quarter of the device memory free at the
            call; larger problems run in groups of kv heads through one buffer, and a problem
            whose one kv head does not fit takes "split". Default: 4 GiB.
    """

    dq: Literal["ds", "split"] = "ds"
    ds_bytes: int = 4 << 30

    def __post_init__(self):
        if self.dq not in ("ds", "split"):
            raise ValueError(f"AttnRecipe.dq must be 'ds' or 'split', got {self.dq!r}")
        if self.ds_bytes < 0:
            raise ValueError(f"AttnRecipe.ds_bytes must be >= 0, got {self.ds_bytes}")


# dQ from dS was 7% faster than the split kernel for gated full attention (BENCHMARKS.md, "Tried
# and dropped"); the split kernel stays as the path of windows, packed batches and NSA's keys.
RECIPES: dict[str, AttnRecipe] = {"ds": AttnRecipe(), "split": AttnRecipe(dq="split")}


def ds_applies(window, cu, kstride: int, koff: int, qoff: int) -> bool:
    """Whether dQ can come from dS: no window, fixed-length batch, key c at position c, queries at
    or after the first key (the dS tiles are addressed by key and query index alone)."""
    return window is None and cu is None and kstride == 1 and koff == 0 and qoff >= 0


def default_recipe(window, cu, kstride: int, koff: int, qoff: int) -> AttnRecipe:
    """The recipe of a call: dQ from dS where it applies, else the split kernel."""
    return RECIPES["ds" if ds_applies(window, cu, kstride, koff, qoff) else "split"]


def pick(name: str, window, cu, kstride: int, koff: int, qoff: int) -> AttnRecipe:
    """The recipe `name` of `RECIPES` ("" for `default_recipe`); a ValueError names the known ones,
    or says why "ds" does not apply to this call."""
    if not name:
        return default_recipe(window, cu, kstride, koff, qoff)
    if name not in RECIPES:
        raise ValueError(f"unknown attention recipe {name!r}; known: {', '.join(RECIPES)}")
    chosen = RECIPES[name]
    if chosen.dq == "ds" and not ds_applies(window, cu, kstride, koff, qoff):
        raise ValueError("the attention recipe 'ds' needs no window, no cu_seqlens and plain key positions")
    return chosen
