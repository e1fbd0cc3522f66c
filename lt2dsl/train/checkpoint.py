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

`Saver` writes one process's checkpoints in a background thread (`checkpoint.async_save`): the step
copies the whole state to host memory (the only part the training waits for; a copy, since the
next steps update the tensors in place), a thread writes and publishes the folder and prunes old
ones, and the next save or the end of the run waits for it. The host copies land in buffers the
`Saver` keeps from save to save (`HostStage`: page-locked when CUDA is present, so every device
tensor's copy is queued at once and the step waits once, at the copy engine's speed, rather than
for one pageable copy after another); a save starts only after the previous one's thread ended,
so the buffers are free again. Sharded runs save within the step.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import threading
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
    async_save: bool = True
    """One process: write in a background thread from a host copy taken at the step (`Saver`);
    the training waits only for the copy, into host buffers (page-locked beside a GPU) that stay
    allocated between saves: host memory of one state. Sharded runs always save within the step."""


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
    if d.world == 1:
        return _write_single(root, step, _Snapshot.of(step, tokens_seen, state, d, None))
    final_dir, tmp = _folders(root, step)
    if d.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    d.barrier()
    torch.save(rng_state(), tmp / f"rng-rank{d.rank}.pt")
    if d.main:
        atomic_write(tmp / "train_state.json", _train_state(step, tokens_seen, state, d))
    _save_sharded(tmp, state, d, final)
    d.barrier()
    if d.main:
        _publish(tmp, final_dir)
    d.barrier()
    return final_dir


def _folders(root: Path, step: int) -> tuple[Path, Path]:
    final_dir = root / f"step-{step:06d}"
    return final_dir, root / f"{final_dir.name}.tmp"


def _train_state(step: int, tokens_seen: int, state: Stateful, d) -> bytes:
    train_state = {
        "step": step,
        "tokens_seen": tokens_seen,
        "world": d.world,
        "data": state.loader.state_dict(),
        "scheduler": _plain(state.scheduler.state_dict()),
    }
    return json.dumps(train_state, indent=1).encode()


@dataclass(frozen=True)
class _Snapshot:
    """One process's checkpoint content at a step: host tensors (for a background save copies in a
    `HostStage`, which later in-place updates of the live state do not reach) and the encoded
    `train_state.json`."""

    step: int
    rng: dict
    train_state: bytes
    optimizer: dict
    weights: dict[str, torch.Tensor]

    @classmethod
    def of(cls, step: int, tokens_seen: int, state: Stateful, d, stage: HostStage | None) -> _Snapshot:
        """The snapshot in `stage`'s buffers, or (None) the host tensors themselves, device ones
        moved: for a save written before the step returns."""
        optim = get_optimizer_state_dict(state.model, state.optimizer)
        weights = get_model_state_dict(state.model)
        if stage is None:
            optim, weights = _to_host(optim), {k: v.contiguous() for k, v in _to_host(weights).items()}
        else:
            optim, weights = stage.copy(optim, ("optimizer",)), stage.copy(weights, ("weights",))
            stage.wait()
        return cls(step, rng_state(), _train_state(step, tokens_seen, state, d), optim, weights)


class HostStage:
    """Host buffers for a state's tensors, kept from one snapshot to the next: `copy(value)` is
    `value` with each tensor replaced by its buffer (contiguous, allocated on first use or when
    the shape or dtype changed; page-locked when CUDA is present) holding a copy of it, the device
    copies queued without waiting; `wait()` waits for them. A buffer is rewritten by the next
    `copy`, so a snapshot's tensors are valid until then (`Saver` writes them before)."""

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.devices: set[torch.device] = set()

    def copy(self, value, path: tuple):
        if torch.is_tensor(value):
            t = value.detach()
            buf = self.buffers.get(path)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = self.buffers[path] = _host_buffer(t)
            buf.copy_(t, non_blocking=t.is_cuda and buf.is_pinned())
            if t.is_cuda:
                self.devices.add(t.device)
            return buf
        if isinstance(value, dict):
            return {k: self.copy(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.copy(v, (*path, i)) for i, v in enumerate(value))
        return value

    def wait(self) -> None:
        """Wait for the queued device-to-host copies (and the work queued before them)."""
        for device in self.devices:
            torch.cuda.synchronize(device)
        self.devices.clear()


def _host_buffer(t: torch.Tensor) -> torch.Tensor:
    """An empty contiguous host tensor like `t`: page-locked for a device tensor (its copy is then
    asynchronous), pageable where the host has no page-locked memory left."""
    if t.is_cuda:
        try:
            return torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        except RuntimeError:
            pass
    return torch.empty(t.shape, dtype=t.dtype)


def _to_host(value):
    """`value` with every tensor on the host (host tensors as they are)."""
    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_host(v) for v in value)
    return value


def _write_single(root: Path, step: int, snap: _Snapshot) -> Path:
    """`root/step-N/` of one process from `snap`, written into `step-N.tmp/` and then renamed."""
    from safetensors.torch import save_file

    final_dir, tmp = _folders(root, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(snap.rng, tmp / "rng-rank0.pt")
    atomic_write(tmp / "train_state.json", snap.train_state)
    torch.save(snap.optimizer, tmp / "optimizer.pt")
    save_file(snap.weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    write_index(tmp, snap.weights)
    _publish(tmp, final_dir)
    return final_dir


class Saver:
    """A run's checkpoint writer: `save` as the module function, or with `background` (one
    process) a host snapshot now and the files from a thread, which then prunes to `keep` (as
    `prune`). One save is in flight at a time: `save` and `wait` first wait for the previous one,
    and `wait` raises what its thread raised."""

    def __init__(self, root: Path, d, keep: int, background: bool):
        self.root, self.d, self.keep = root, d, keep
        self.background = background and d.world == 1
        self.stage = HostStage()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, step: int, tokens_seen: int, state: Stateful, final: bool = False) -> Path:
        self.wait()
        if not self.background:
            folder = save(self.root, step, tokens_seen, state, self.d, final)
            if self.d.main:
                prune(self.root, self.keep)
            self.d.barrier()
            return folder
        snap = _Snapshot.of(step, tokens_seen, state, self.d, self.stage)
        self._thread = threading.Thread(target=self._write, args=(snap,), name=f"checkpoint-{step}")
        self._thread.start()
        return _folders(self.root, step)[0]

    def _write(self, snap: _Snapshot) -> None:
        try:
            _write_single(self.root, snap.step, snap)
            prune(self.root, self.keep)
        except BaseException as e:  # raised again by `wait`, in the training's thread
            self._error = e

    def wait(self) -> None:
        """Wait for the save in flight (if any); raise the error it met."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"writing a checkpoint under {self.root} failed: {error}") from error


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
    """Restore `state` from a complete checkpoint; returns its `train_state.json`. A checkpoint
    that is unreadable, incomplete or of another model is a ValueError naming the file and what
    was expected; nothing on disk changes."""
    if not is_complete(folder):
        raise ValueError(f"`{folder}` is not a complete checkpoint (no index or train_state.json)")
    with _reading(folder / "train_state.json"):
        train_state = json.loads((folder / "train_state.json").read_text())
        missing = [k for k in ("step", "scheduler", "data") if k not in train_state]
        if missing:
            raise ValueError(f"no {', '.join(missing)}: not a train state `lt2dsl train` wrote")
    if (folder / DCP_INDEX).is_file():
        with _reading(folder / "dcp"):
            _load_sharded(folder, state)
    else:
        _load_single(folder, state)
    with _reading(folder / "train_state.json"):
        state.scheduler.load_state_dict(train_state["scheduler"])
        state.loader.load_state_dict(train_state["data"])
    rng = folder / f"rng-rank{d.rank}.pt"
    if train_state.get("world") == d.world and rng.is_file():
        with _reading(rng):
            set_rng_state(torch.load(rng, weights_only=False))
    return train_state


@contextlib.contextmanager
def _reading(path: Path):
    """Any error while reading or applying `path` as a ValueError that names it (the CLI prints
    it as `error: ...`), the original chained."""
    try:
        yield
    except Exception as e:
        raise ValueError(f"checkpoint file `{path}` cannot be loaded: {type(e).__name__}: {e}") from e


def _load_single(folder: Path, state: Stateful) -> None:
    from safetensors.torch import load_file

    with _reading(folder / "model.safetensors"):
        weights = load_file(str(folder / "model.safetensors"))
    _check_shapes(folder / "model.safetensors", weights, get_model_state_dict(state.model))
    set_model_state_dict(state.model, weights, options=StateDictOptions(full_state_dict=True))
    with _reading(folder / "optimizer.pt"):
        osd = torch.load(folder / "optimizer.pt", weights_only=False, map_location="cpu")
        set_optimizer_state_dict(state.model, state.optimizer, osd, options=OPTIM_LOAD)


def _check_shapes(path: Path, stored: dict[str, torch.Tensor], model: dict[str, torch.Tensor]) -> None:
    """A ValueError when the stored weights are not the model's names and shapes (the run's
    `.lt2` file or its `set` overrides changed since the checkpoint was written)."""
    missing = sorted(set(model) - set(stored))
    extra = sorted(set(stored) - set(model))
    shapes = [k for k in model if k in stored and tuple(stored[k].shape) != tuple(model[k].shape)]
    if not (missing or extra or shapes):
        return
    parts = []
    if shapes:
        k = shapes[0]
        parts.append(
            f"{len(shapes)} shapes differ (`{k}`: {list(stored[k].shape)} stored, "
            f"{list(model[k].shape)} in the model)"
        )
    if missing:
        parts.append(f"{len(missing)} of the model's tensors missing (`{missing[0]}`)")
    if extra:
        parts.append(f"{len(extra)} tensors the model does not have (`{extra[0]}`)")
    raise ValueError(
        f"`{path}` holds another model's weights: {'; '.join(parts)}. Resume with the model the "
        "checkpoint was written for (the run's .lt2 file and its `set` overrides)"
    )


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
