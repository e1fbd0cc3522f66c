"""A local Hugging Face checkpoint folder: `config.json` and its safetensors (one file, or shards with
`model.safetensors.index.json`). Nothing here reaches the hub: a folder that lacks them is refused.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from lt2dsl.hf.refuse import Refused

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass(frozen=True)
class Checkpoint:
    """The folder `root`, its parsed `config` and the text it was parsed from (for diagnostics)."""

    root: Path
    config: dict
    config_text: str

    @property
    def config_path(self) -> str:
        return str(self.root / "config.json")


def open_checkpoint(root: str | os.PathLike) -> Checkpoint:
    """Read `root/config.json`; refuse a folder that is not a checkpoint (field `config.json`)."""
    root = Path(root)
    path = root / "config.json"
    if not root.is_dir():
        raise Refused("", f"`{root}` is not a checkpoint folder", file=str(root))
    if not path.is_file():
        raise Refused("", f"`{root}` has no config.json", file=str(path))
    text = path.read_text(encoding="utf-8")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise Refused("", f"config.json is not JSON: {e.msg} at line {e.lineno}", file=str(path)) from None
    if not isinstance(config, dict):
        raise Refused("", "config.json must hold a JSON object", file=str(path))
    return Checkpoint(root, config, text)


def weight_files(ckpt: Checkpoint) -> list[Path]:
    """The safetensors files of the checkpoint: the index's shards, else `model.safetensors`."""
    index = ckpt.root / INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        files = [ckpt.root / s for s in shards]
    else:
        files = [ckpt.root / SINGLE]
    missing = [str(f.name) for f in files if not f.is_file()]
    if missing:
        raise Refused("", f"missing weight files: {', '.join(missing)}", file=str(ckpt.root))
    return files


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every stored tensor, read file by file (never the whole set at once)."""
    from safetensors import safe_open

    with ExitStack() as stack:
        for f in files:
            handle = stack.enter_context(safe_open(str(f), framework="pt"))
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, handle.get_tensor(name)


def save_safetensors(
    tensors: Mapping[str, torch.Tensor], path: str | os.PathLike, metadata: dict | None = None
):
    """Write `tensors` to `path` atomically (a temp file in the same folder, then `os.replace`)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
