"""Checkpoints: `step-{N:06d}/` folders that count only once their index exists.

A checkpoint holds everything a run needs to continue exactly: the model, the optimizer, the
scheduler, the loader's position, the RNG states and `train_state.json` (`step`, `tokens_seen`).

* One process: `model.safetensors` (weights under `LT2Model`'s names, loadable with
  `model.load_state_dict(safetensors.torch.load_file(...))`) and `optimizer.pt` (keyed by
  parameter name); the index `model.safetensors.index.json` is written last.
* Several processes: `torch.distributed.checkpoint` (each process writes its shards) into `dcp/`,
  whose `.metadata` DCP writes last; such a checkpoint loads at any number of processes, one
  included. The final checkpoint also gets a whole `model.safetensors`.

Everything is written into `step-N.tmp/` and the folder renamed to `step-N/` once complete, so a
kill during a save leaves at most a `.tmp` folder, which is never loaded (nanochat writes its
manifest last for the same reason; torchtitan's `_find_load_step` requires the index).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from lt2dsl.train.files import atomic_write

STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)
STEP_DIR = re.compile(r"^step-(\d{6,})$")
INDEX = "model.safetensors.index.json"
DCP_INDEX = Path("dcp") / ".metadata"
# Strict: every trained parameter has a gradient (the DSA indexers from their own loss, or frozen
# with `training.indexer_loss = 0`), hence optimizer state after the first step.
OPTIM_LOAD = StateDictOptions(full_state_dict=True)


class CheckpointConfig(BaseModel):
    """When and where checkpoints are written."""

    model_config = STRICT

    enable: bool = True
    """Write checkpoints (the final step always gets one when enabled)."""
    interval: int = Field(default=500, gt=0)
    """Steps between checkpoints."""
    keep_latest_k: int = Field(default=3, ge=0)
    """Keep this many complete checkpoints (0: all)."""
    folder: str = "checkpoints"
    """Subfolder of `training.out`."""


@dataclass
class Stateful:
    """What a checkpoint saves and restores: `model` is the training module (`TrainModel`)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: object


def step_of(folder: Path) -> int | None:
    m = STEP_DIR.match(folder.name)
    return int(m.group(1)) if m else None


def is_complete(folder: Path) -> bool:
    """A step folder whose index exists (and so everything written before it)."""
    if step_of(folder) is None or not (folder / "train_state.json").is_file():
        return False
    return (folder / INDEX).is_file() or (folder / DCP_INDEX).is_file()


def complete(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if is_complete(p)), key=step_of)


def latest(root: Path) -> Path | None:
    found = complete(root)
    return found[-1] if found else None


# ---- saving -------------------------------------------------------------------------------------


def save(root: Path, step: int, tokens_seen: int, state: Stateful, d, final: bool = False) -> Path:
    """Write `root/step-{step:06d}/` (see the module docstring); every process calls it."""
    final_dir = root / f"step-{step:06d}"
    tmp = root / f"{final_dir.name}.tmp"
    if d.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    d.barrier()
    torch.save(rng_state(), tmp / f"rng-rank{d.rank}.pt")
    if d.main:
        train_state = {
            "step": step,
            "tokens_seen": tokens_seen,
            "world": d.world,
            "data": state.loader.state_dict(),
            "scheduler": _plain(state.scheduler.state_dict()),
        }
        atomic_write(tmp / "train_state.json", json.dumps(train_state, indent=1).encode())
    if d.world == 1:
        _save_single(tmp, state)
    else:
        _save_sharded(tmp, state, d, final)
    d.barrier()
    if d.main:
        _publish(tmp, final_dir)
    d.barrier()
    return final_dir


def _save_single(tmp: Path, state: Stateful) -> None:
    from safetensors.torch import save_file

    torch.save(get_optimizer_state_dict(state.model, state.optimizer), tmp / "optimizer.pt")
    weights = _contiguous(get_model_state_dict(state.model))
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    write_index(tmp, weights)


def _save_sharded(tmp: Path, state: Stateful, d, final: bool) -> None:
    import torch.distributed.checkpoint as dcp

    if final:
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(state.model, options=full)
        if d.main:
            from safetensors.torch import save_file

            save_file(_contiguous(weights), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    sd = {
        "model": get_model_state_dict(state.model),
        "optim": get_optimizer_state_dict(state.model, state.optimizer),
    }
    dcp.save(sd, checkpoint_id=str(tmp / "dcp"))


def _plain(value):
    """`value` with every tensor as its number (or list): the scheduler's state names the learning
    rates, which are device tensors under `training.cuda_graph`."""
    if torch.is_tensor(value):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def write_index(folder: Path, weights: dict[str, torch.Tensor]) -> None:
    """`model.safetensors.index.json` (the HF layout): its existence marks the folder complete."""
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {
        "metadata": {"total_size": total},
        "weight_map": dict.fromkeys(sorted(weights), "model.safetensors"),
    }
    atomic_write(folder / INDEX, json.dumps(index, indent=1).encode())


def _contiguous(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in sd.items()}


def _publish(tmp: Path, final_dir: Path) -> None:
    """Rename the complete `tmp` to `final_dir` (replacing an older folder of the same step)."""
    if final_dir.exists():
        old = final_dir.with_name(final_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final_dir, old)
        os.replace(tmp, final_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final_dir)


def prune(root: Path, keep: int) -> None:
    """Delete all but the `keep` newest complete checkpoints, and leftover `.tmp` folders."""
    for p in root.glob("step-*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
    if keep <= 0:
        return
    for p in complete(root)[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


# ---- loading ------------------------------------------------------------------------------------


def load(folder: Path, state: Stateful, d) -> dict:
    """Restore `state` from a complete checkpoint; returns its `train_state.json`."""
    if not is_complete(folder):
        raise ValueError(f"`{folder}` is not a complete checkpoint (no index or train_state.json)")
    train_state = json.loads((folder / "train_state.json").read_text())
    if (folder / DCP_INDEX).is_file():
        _load_sharded(folder, state)
    else:
        _load_single(folder, state)
    state.scheduler.load_state_dict(train_state["scheduler"])
    state.loader.load_state_dict(train_state["data"])
    rng = folder / f"rng-rank{d.rank}.pt"
    if train_state.get("world") == d.world and rng.is_file():
        set_rng_state(torch.load(rng, weights_only=False))
    return train_state


def _load_single(folder: Path, state: Stateful) -> None:
    from safetensors.torch import load_file

    set_model_state_dict(
        state.model,
        load_file(str(folder / "model.safetensors")),
        options=StateDictOptions(full_state_dict=True),
    )
    osd = torch.load(folder / "optimizer.pt", weights_only=False, map_location="cpu")
    set_optimizer_state_dict(state.model, state.optimizer, osd, options=OPTIM_LOAD)


def _load_sharded(folder: Path, state: Stateful) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    sd = {
        "model": get_model_state_dict(state.model),
        "optim": get_optimizer_state_dict(state.model, state.optimizer),
    }
    planner = DefaultLoadPlanner()
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(sd, checkpoint_id=str(folder / "dcp"), planner=planner, no_dist=not dist.is_initialized())
    set_model_state_dict(state.model, sd["model"])
    set_optimizer_state_dict(state.model, state.optimizer, sd["optim"])


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
