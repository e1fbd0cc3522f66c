"""The dtypes lt2dsl names: one table from a name to its size in bytes and its torch dtype.

The model settings (`dtype`, `state_dtype`), the estimate's flags and the lowering all read this
table. It never imports torch, so the estimate path stays torch-free; `torch_dtype` imports torch
on first use.

Roles: a `setting` dtype may be named by a model, sized by the estimate and run by the lowering;
`compute` (fp64) is run by the lowering only (float64 checks); `storage` (fp8) is sized by the
estimate only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DType:
    name: str  # canonical, as a `.lt2` file spells it
    nbytes: int
    torch_name: str  # the attribute of `torch`
    aliases: tuple[str, ...] = ()
    role: Literal["setting", "compute", "storage"] = "setting"


TABLE: dict[str, DType] = {
    d.name: d
    for d in (
        DType("fp32", 4, "float32", ("float32",)),
        DType("bf16", 2, "bfloat16", ("bfloat16",)),
        DType("fp16", 2, "float16", ("float16",)),
        DType("fp64", 8, "float64", ("float64",), role="compute"),
        DType("fp8", 1, "float8_e4m3fn", role="storage"),
    )
}
_BY_NAME = {a: d for d in TABLE.values() for a in (d.name, *d.aliases)}

# What a model computes in (weights, activations, KV caches) and keeps recurrent states in,
# unless its `dtype` / `state_dtype` settings say otherwise.
DEFAULT_DTYPE = "bf16"
DEFAULT_STATE_DTYPE = "fp32"

SETTING_DTYPES = tuple(d.name for d in TABLE.values() if d.role == "setting")
ESTIMATE_DTYPES = tuple(d.name for d in TABLE.values() if d.role != "compute")
LOWERING_DTYPES = tuple(a for d in TABLE.values() if d.role != "storage" for a in (d.name, *d.aliases))


def lookup(name: str) -> DType:
    """The table entry of a name or alias (`bf16`, `bfloat16`); KeyError for an unknown one."""
    return _BY_NAME[name]


def nbytes(name: str) -> int:
    """Bytes per element of a dtype name (`fp32` → 4)."""
    return lookup(name).nbytes


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The floating-point torch dtype the lowering computes in, from a name or a torch dtype.

    Raises:
        ValueError: an unknown name, a storage-only one (fp8), or a non-floating torch dtype.
    """
    import torch

    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        return dtype
    if dtype not in LOWERING_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(LOWERING_DTYPES)} or a torch.dtype, got {dtype!r}")
    return getattr(torch, lookup(dtype).torch_name)


@dataclass(frozen=True)
class Dtypes:
    """The dtypes the estimate sizes tensors in; None stands for the model's own.

    `act` covers weights and activations, `state` recurrent states and conv buffers, `kv` the
    caches that grow with the context (the activation dtype unless given, as the lowering keeps
    them).
    """

    act: str | None = None
    state: str | None = None
    kv: str | None = None

    def resolve(self, dtype: str, state_dtype: str) -> Dtypes:
        """Every field named: the model's `dtype` / `state_dtype` where this one has None."""
        act = self.act or dtype
        return Dtypes(act=act, state=self.state or state_dtype, kv=self.kv or act)

    def nbytes(self, role: str) -> int:
        """Bytes per element of the dtype of `role` ("act", "state" or "kv"), once resolved."""
        name = getattr(self, role)
        if name is None:
            raise ValueError(f"the `{role}` dtype is not resolved yet: call `Dtypes.resolve` first")
        return nbytes(name)
