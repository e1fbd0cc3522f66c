"""`lt2dsl import` and `lt2dsl.from_pretrained`: a local HF checkpoint folder → `.lt2` + weights.

    ckpt = open_checkpoint(dir)            # config.json (never the hub)
    plan = READERS[model_type](config)     # the program and the weight maps, or `Refused`
    text = fmt(lt2_text(plan))             # the canonical printer's form
    model = resolve(text)                  # validated like any .lt2 file
    state = native_state(plan, model, ...) # every stored tensor mapped, every parameter filled

The mapping is checked against the estimate's parameter table (`model_weights`), so a tensor the
plan does not place, a parameter the checkpoint lacks, or a shape that differs is refused rather
than silently dropped or left random.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from lt2dsl.cost.estimate import model_weights
from lt2dsl.hf import families, fla
from lt2dsl.hf.checkpoint import Checkpoint, iter_tensors, open_checkpoint, weight_files
from lt2dsl.hf.common import refuse_moe
from lt2dsl.hf.plan import Plan, lt2_text
from lt2dsl.hf.refuse import Refused
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup

READERS = families.READERS | fla.READERS


@dataclass(frozen=True)
class Imported:
    """An imported checkpoint: its `.lt2` text, resolved model and weights under our names."""

    text: str
    model: n.Model
    state: dict[str, torch.Tensor]
    plan: Plan


def read_plan(ckpt: Checkpoint) -> Plan:
    """The family reader's plan of the checkpoint's config (`Refused` for an unknown model type)."""
    cfg = ckpt.config
    refuse_moe(cfg)  # before the model type: `qwen3_moe` is refused for its experts
    kind = cfg.get("model_type")
    if kind not in READERS:
        raise Refused(
            "model_type",
            f"model type `{kind}` cannot be imported",
            help=f"lt2dsl imports {', '.join(f'`{k}`' for k in READERS)}",
        )
    name = re.sub(r"\W", "_", ckpt.root.resolve().name) or "imported"
    if not re.match(r"[A-Za-z_]", name):
        name = f"m_{name}"
    try:
        return READERS[kind](cfg, name)
    except KeyError as e:
        key = e.args[0] if e.args else None
        if not isinstance(key, str) or _has_key(cfg, key):
            raise  # not a missing config key: a bug of the reader
        raise Refused(
            "",
            f"config.json has no `{key}`, which a `{kind}` config gives",
            help=f"transformers writes `{key}` into every `{kind}` config.json: was it edited or cut short?",
            file=str(ckpt.root / "config.json"),
        ) from e


def _has_key(cfg, key: str) -> bool:
    """Whether `key` is a key of `cfg` or of a config nested in it (`text_config`)."""
    if not isinstance(cfg, dict):
        return False
    return key in cfg or any(_has_key(v, key) for v in cfg.values())


def program_text(plan: Plan, source: str) -> tuple[str, n.Model]:
    """The plan's `.lt2` text in canonical form and its resolved model (validated)."""
    from lt2dsl.cli import format_text
    from lt2dsl.frontend import load

    raw = lt2_text(plan, source)
    text, diags = format_text(raw, "<import>")
    loaded = load(text) if text is not None else None
    if loaded is None or loaded.model is None:
        problems = diags or (loaded.diagnostics if loaded else [])
        raise AssertionError(f"internal error in `lt2dsl import`: the written program is invalid: {problems}")
    return text, loaded.model


def key_map(plan: Plan) -> dict[str, str | None]:
    """Every HF key the plan places → our parameter name (None: dropped on purpose)."""
    out: dict[str, str | None] = dict(plan.model_map)
    for i, layer in enumerate(plan.layers):
        out |= {hf.format(i): f"blocks.{i}.{ours}" for hf, ours in layer.block_map.items()}
        prefix = layer.mixer.format(i)
        for hf, ours in lookup(layer.kind).hf_map.items():
            out[prefix + hf] = None if ours is None else f"blocks.{i}.mixers.0.{ours}"
    return out


def native_state(plan: Plan, model: n.Model, tensors: Iterable[tuple[str, torch.Tensor]]) -> dict:
    """The stored tensors under our names, checked against the model's parameter table."""
    keys, want = key_map(plan), model_weights(model)
    state, stray = {}, []
    for name, t in tensors:
        ours = keys.get(name, name if name not in keys else None)
        if name in keys and ours is None:
            continue
        if ours not in want:
            stray.append(name)
            continue
        if tuple(t.shape) != tuple(want[ours]):
            raise Refused("", f"`{name}` has shape {list(t.shape)}, the config implies {list(want[ours])}")
        state[ours] = t
    if stray:
        raise Refused("", f"weights the config does not describe: {_few(stray)}")
    missing = sorted(set(want) - set(state))
    if missing:
        inverse = {v: k for k, v in keys.items() if v}
        raise Refused("", f"the checkpoint lacks weights: {_few([inverse.get(m, m) for m in missing])}")
    return state


def _few(names: list[str], k: int = 4) -> str:
    shown = ", ".join(f"`{x}`" for x in names[:k])
    return shown + (f" and {len(names) - k} more" if len(names) > k else "")


def import_checkpoint(root: str | os.PathLike) -> Imported:
    """Read a local checkpoint folder into an `Imported` (raises `Refused`)."""
    ckpt = open_checkpoint(root)
    plan = read_plan(ckpt)
    text, model = program_text(plan, Path(root).name)
    state = native_state(plan, model, iter_tensors(weight_files(ckpt)))
    return Imported(text, model, state, plan)


def from_pretrained(
    root: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
    backend: str = "auto",
    fuse: bool = True,
):
    """The `LT2Model` of a local Hugging Face checkpoint folder, its weights loaded.

    Args:
        root: a folder with `config.json` and safetensors (one file or shards with an index).
        dtype (Optional): parameter dtype; default the checkpoint's (its config's `dtype`).
        backend (str, Optional): kernel backend, as `lt2dsl.compile`. Default: "auto".
        fuse (bool, Optional): run the FX fusion passes. Default: True.

    Raises:
        ValueError (`Refused`): a checkpoint `.lt2` cannot express, or whose weights do not match.
    """
    from lt2dsl.lowering import compile_model

    imp = import_checkpoint(root)
    # Parameters are made on the meta device and replaced by the loaded tensors (no random init of
    # a large model); a model with buffers (computed, not stored) is built for real instead.
    model = compile_model(imp.model, backend=backend, device="meta", dtype=dtype, fuse=fuse)
    meta = not any(True for _ in model.buffers())
    if not meta:
        model = compile_model(imp.model, backend=backend, dtype=dtype, fuse=fuse)
    dt = next(model.parameters()).dtype
    model.load_state_dict({k: v.to(dt) for k, v in imp.state.items()}, strict=True, assign=meta)
    model.rebuild_graph()
    model.lt2_source = imp.text
    return model
