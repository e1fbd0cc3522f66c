"""The layer-kind registry: one `LayerSpec` per kind, looked up by name or alias."""

from __future__ import annotations

from importlib import import_module

from lt2dsl.ir.spec import LayerSpec

# Order is the order of language.md §5 and of the generated docs.
KINDS = (
    "full",
    "swa",
    "dsa",
    "nsa",
    "gdn",
    "kda",
    "deltanet",
    "gla",
    "retnet",
    "mamba2",
    "mlstm",
    "linear",
    "tmm",
)

REGISTRY: dict[str, LayerSpec] = {k: import_module(f"lt2dsl.ir.specs.{k}").SPEC for k in KINDS}
ALIASES: dict[str, str] = {a: s.kind for s in REGISTRY.values() for a in s.aliases}


def lookup(name: str) -> LayerSpec | None:
    """The spec for a kind or alias, None when unknown."""
    return REGISTRY.get(ALIASES.get(name, name))


def all_names() -> list[str]:
    """Kinds and aliases: the candidates for "did you mean"."""
    return [*REGISTRY, *ALIASES]
