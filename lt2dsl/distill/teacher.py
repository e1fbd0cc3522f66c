"""Loading models with weights: the teacher, and a student's starting weights.

A teacher is a `.lt2` program plus its weights (a `.safetensors` file under `LT2Model`'s names, a
trainer checkpoint folder or a trainer run folder), or a Hugging Face checkpoint folder: one that
`lt2dsl import` reads (`lt2dsl.hf`), or an `LT2ForCausalLM` written by `save_pretrained`
(`model_type = "lt2"`: the program is in its config, the weights under `model.`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from lt2dsl.train import checkpoint as ckpt

WEIGHTS = "model.safetensors"


@dataclass
class Loaded:
    """A model with its weights and the `.lt2` text it was compiled from."""

    model: torch.nn.Module
    text: str


def load_teacher(file: Path | None, weights: Path | None, hf: Path | None, backend: str) -> Loaded:
    """The teacher (module docstring), fp32, unfused, on the CPU, frozen.

    Raises:
        ValueError: a missing file, weights that do not fit the program, a checkpoint `.lt2`
            cannot express (`lt2dsl.hf.Refused`).
    """
    if hf is not None:
        text, state = _hf(hf)
    else:
        if not file.is_file():
            raise ValueError(f"teacher.file: cannot read `{file}`")
        text, state = file.read_text(encoding="utf-8"), read_weights(weights, "teacher.weights")
    model = build(file if hf is None else text, backend, str(file or hf))
    load_into(model, state, "the teacher's weights")
    model.requires_grad_(False)
    return Loaded(model, text)


def build(source: str | Path, backend: str, where: str):
    """The `.lt2` program (text, or a file: its diagnostics and spans then name it) compiled in
    fp32, unfused (the trainer's form); `lt2_source` holds its text."""
    from lt2dsl import compile as compile_lt2
    from lt2dsl.diagnostics import DiagnosticError

    try:
        model = compile_lt2(source, backend=backend, dtype=torch.float32, fuse=False)
    except DiagnosticError as e:
        raise ValueError(f"`{where}` has errors:\n{e}") from None
    model.lt2_source = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
    return model


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Load `state` into `model`, every parameter and nothing else; ValueError naming the first
    names that differ."""
    want = model.state_dict()
    missing = sorted(set(want) - set(state))
    stray = sorted(set(state) - set(want))
    wrong = sorted(k for k in set(want) & set(state) if want[k].shape != state[k].shape)
    problems = [
        f"{label}: {', '.join(f'`{k}`' for k in names[:4])}"
        for label, names in (("missing", missing), ("not in the program", stray), ("other shapes", wrong))
        if names
    ]
    if problems:
        raise ValueError(f"{what} do not fit the program ({'; '.join(problems)})")
    model.load_state_dict({k: v.to(want[k].dtype) for k, v in state.items()}, strict=True)


def read_weights(path: Path, field: str) -> dict[str, torch.Tensor]:
    """The tensors of a `.safetensors` file, of a folder holding `model.safetensors` (a checkpoint
    or a stage folder), of a trainer run folder's newest complete checkpoint, or of a checkpoints
    folder's newest."""
    if path.is_file():
        return _safetensors(path, field)
    if not path.is_dir():
        raise ValueError(f"{field}: `{path}` does not exist")
    for folder in (path, ckpt.latest(path / "checkpoints"), ckpt.latest(path)):
        if folder is not None and (folder / WEIGHTS).is_file():
            return _safetensors(folder / WEIGHTS, field)
    raise ValueError(f"{field}: `{path}` holds no `{WEIGHTS}` (nor a complete checkpoint with one)")


def _safetensors(path: Path, field: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{field}: `{path}` is not a safetensors file: {e}") from e


def _hf(root: Path) -> tuple[str, dict[str, torch.Tensor]]:
    config = root / "config.json"
    if not config.is_file():
        raise ValueError(f"teacher.hf: `{root}` has no config.json")
    if json.loads(config.read_text()).get("model_type") == "lt2":
        return _lt2_folder(root, json.loads(config.read_text()))
    from lt2dsl.hf.importer import import_checkpoint

    imp = import_checkpoint(root)
    return imp.text, imp.state


def _lt2_folder(root: Path, config: dict) -> tuple[str, dict[str, torch.Tensor]]:
    """An `LT2ForCausalLM.save_pretrained` folder: the program in the config, weights under `model.`."""
    from lt2dsl.hf.checkpoint import iter_tensors, open_checkpoint, weight_files

    text = config.get("lt2_source") or ""
    if not text:
        raise ValueError(f"teacher.hf: `{root}/config.json` has no `lt2_source`")
    tensors = iter_tensors(weight_files(open_checkpoint(root)))
    return text, {k.removeprefix("model."): v for k, v in tensors}
