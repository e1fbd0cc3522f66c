"""Lowering: a resolved `Model` → `LT2Model` (an `nn.Module` running a traced `torch.fx` graph).

`compile_model` is what `lt2dsl.compile` calls; it accepts `.lt2` text or a path (through the
front end), a surface `Program`, or an already resolved `Model`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch

from lt2dsl.dtypes import torch_dtype
from lt2dsl.ir import nodes as n
from lt2dsl.lowering.cache import Cache, Entry
from lt2dsl.lowering.model import LT2Model
from lt2dsl.passes.overrides import apply_overrides, as_node, override_model

__all__ = ["Cache", "Entry", "LT2Model", "compile_model", "resolve_source"]


def compile_model(
    source: str | os.PathLike | n.Program | n.Model,
    *,
    backend: str = "auto",
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    overrides: Mapping[str, Any] | None = None,
    fuse: bool = True,
    build_graph: bool | None = None,
    opt_in: Sequence[str] = (),
) -> LT2Model:
    """Build the `LT2Model` of `source`.

    Args:
        source: a path or `.lt2` text, a surface `Program`, or a resolved `Model`.
        backend (str, Optional): "reference", "triton" or "auto". Default: "auto".
        device (Optional): where parameters are created (`"meta"` allocates nothing). Default: the
            current default device.
        dtype (Optional): parameter / activation dtype; default the model's `dtype` setting.
        overrides (Optional): `--set` style settings, e.g. `{"loop_T": 8, "dim": 256}`.
        fuse (bool, Optional): run the FX fusion passes over the lowered graph. Default: True.
        opt_in (Sequence[str], Optional): fusion rules that are off by default to run too
            (`fx_passes.OPT_IN`, e.g. "decode_gemv"); needs `fuse`. Default: none.
        build_graph (bool, Optional): trace and fuse the graph here, so a first forward or generate
            does not. Default: on CUDA only; never on `meta`, where a model cannot run.
    """
    rules = _opt_in(opt_in, fuse)
    model = resolve_source(source, dict(overrides or {}))
    dt = torch_dtype(dtype if dtype is not None else model.config.dtype)
    device = _device(device)
    with torch.device(device) if device is not None else nullcontext():
        lowered = LT2Model(model, backend=backend)
    if fuse:
        from lt2dsl.lowering.fx_passes import fuse_graph

        lowered.graph_passes.append(partial(fuse_graph, opt_in=rules) if rules else fuse_graph)
    lowered = lowered.to(dtype=dt)
    where = lowered.embed.weight.device.type
    if where != "meta" and (build_graph if build_graph is not None else where == "cuda"):
        # A model moved later (`.to()`) is traced again on its next use.
        lowered.build_graph()
    return lowered


def _opt_in(opt_in: Sequence[str], fuse: bool) -> tuple[str, ...]:
    """The opt-in rule names, checked (ValueError: an unknown one, or any without `fuse`)."""
    if not opt_in:
        return ()
    if not fuse:
        raise ValueError(f"opt_in={tuple(opt_in)!r} names fusion rules, but fuse=False runs none")
    from lt2dsl.lowering.fx_passes import opt_in_names

    return opt_in_names(opt_in)


def resolve_source(source, overrides: dict[str, Any]) -> n.Model:
    """The resolved `Model` of any accepted source, with the overrides applied."""
    if isinstance(source, n.Model):
        return override_model(source, overrides)
    if isinstance(source, n.Program):
        from lt2dsl.passes.resolve import resolve

        return resolve(apply_overrides(source, {k: as_node(v, parse=True) for k, v in overrides.items()}))
    if not isinstance(source, str | os.PathLike):
        raise ValueError(
            f"source must be .lt2 text, a path, a Program or a Model, got {type(source).__name__}"
        )
    from lt2dsl.frontend import load_or_raise

    return load_or_raise(source, {k: as_node(v) for k, v in overrides.items()}).model


def _device(device: torch.device | str | None) -> torch.device | None:
    """`device` as a `torch.device`, refusing one this machine does not have."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"device must be a torch.device or a name like 'cpu' or 'cuda:0', got {device!r}"
        ) from e
    backend = getattr(torch, dev.type, None)
    if dev.type not in ("cpu", "meta") and not (backend and backend.is_available()):
        raise ValueError(
            f"device {str(dev)!r} is not available on this machine (torch.{dev.type}.is_available() is "
            "False); use device='cpu'"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {str(dev)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev
