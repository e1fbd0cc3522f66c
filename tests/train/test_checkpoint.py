"""Checkpoints: kill-and-resume reproduces the uninterrupted losses exactly (CPU, fp32); a crash
during a save never leaves a loadable half-written checkpoint; `keep_latest_k` prunes; a save in a
background thread writes the state of its step, whatever the steps after it change."""

from __future__ import annotations

import re
import shutil
import threading

import pytest
import torch
from safetensors.torch import load_file

from lt2dsl.lowering import compile_model
from lt2dsl.train import checkpoint as ckpt
from lt2dsl.train import run

from .helpers import config


class Killed(Exception):
    pass


def kill_at(step: int):
    def on_step(s, _):
        if s == step:
            raise Killed

    return on_step


def cfg_of(tmp_path, out: str, async_save: bool = True) -> dict:
    return config(
        tmp_path,
        out,
        training={"steps": 10, "grad_accum": 2},
        checkpoint={"enable": True, "interval": 4, "keep_latest_k": 2, "async_save": async_save},
        metrics={"eval_interval": 5},
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    return tmp, run(cfg_of(tmp, "whole"))


@pytest.mark.parametrize("async_save", [True, False])
def test_kill_and_resume_reproduce_the_losses_exactly(uninterrupted, async_save):
    tmp, whole = uninterrupted
    cfg = cfg_of(tmp, f"killed{async_save:d}", async_save)
    with pytest.raises(Killed):
        run(cfg, on_step=kill_at(7))
    resumed = run(cfg, resume=True)
    assert min(resumed.losses) == 5  # continued from the step-4 checkpoint
    assert {s: resumed.losses[s] for s in range(5, 11)} == {s: whole.losses[s] for s in range(5, 11)}
    assert resumed.evals == whole.evals
    root = tmp / f"killed{async_save:d}" / "checkpoints"
    assert [p.name for p in ckpt.complete(root)] == ["step-000008", "step-000010"]  # keep_latest_k = 2


@pytest.mark.parametrize("async_save", [True, False])
def test_a_crash_during_a_save_leaves_the_previous_checkpoint(uninterrupted, monkeypatch, async_save):
    """A save that fails after the weights: in the step (the error itself) or in the background
    (raised by the next save as an error naming the folder, from the original)."""
    tmp, whole = uninterrupted
    cfg = cfg_of(tmp, f"crashed{async_save:d}", async_save)
    real = ckpt.write_index

    def crash_on_step_8(folder, weights):
        if folder.name.startswith("step-000008"):
            raise Killed  # the process dies after the weights, before the index
        real(folder, weights)

    monkeypatch.setattr(ckpt, "write_index", crash_on_step_8)
    with pytest.raises(RuntimeError if async_save else Killed) as info:
        run(cfg)
    root = tmp / f"crashed{async_save:d}" / "checkpoints"
    if async_save:
        assert isinstance(info.value.__cause__, Killed) and str(root) in str(info.value)
    assert (root / "step-000008.tmp" / "model.safetensors").is_file()
    assert not ckpt.is_complete(root / "step-000008.tmp") and not (root / "step-000008").exists()
    assert ckpt.latest(root).name == "step-000004"
    monkeypatch.setattr(ckpt, "write_index", real)
    resumed = run(cfg, resume=True)
    assert {s: resumed.losses[s] for s in range(5, 11)} == {s: whole.losses[s] for s in range(5, 11)}
    assert not (root / "step-000008.tmp").exists()  # cleaned by the next save


def test_saved_weights_load_into_the_compiled_model(uninterrupted):
    tmp, whole = uninterrupted
    folder = whole.checkpoint
    assert folder.name == "step-000010" and ckpt.is_complete(folder)
    model = compile_model(tmp / "model_tied.lt2", backend="reference", dtype=torch.float32, fuse=False)
    weights = load_file(str(folder / "model.safetensors"))
    model.load_state_dict(weights, strict=True)
    assert set(weights) == set(model.state_dict())


def test_resume_from_a_folder_that_is_not_a_checkpoint_is_an_error(uninterrupted):
    tmp, _ = uninterrupted
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        run(cfg_of(tmp, "other"), resume=tmp / "whole")


def damaged(folder, how: str) -> None:
    if how == "weights":
        (folder / "model.safetensors").write_bytes(b"garbage")
    elif how == "optimizer":
        (folder / "optimizer.pt").unlink()
    else:
        (folder / "train_state.json").write_text("{}")


@pytest.mark.parametrize(
    "how, says",
    [
        ("weights", "model.safetensors` cannot be loaded: SafetensorError"),
        ("optimizer", "optimizer.pt` cannot be loaded: FileNotFoundError"),
        ("train_state", "train_state.json` cannot be loaded: ValueError: no step, scheduler, data"),
    ],
)
def test_a_damaged_checkpoint_is_an_error_naming_the_file(uninterrupted, tmp_path, how, says):
    """What `lt2dsl train --resume` prints (`error: ...`), the checkpoint's files left as they were."""
    tmp, whole = uninterrupted
    folder = tmp_path / whole.checkpoint.name
    shutil.copytree(whole.checkpoint, folder)
    damaged(folder, how)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(ValueError, match=re.escape(says)):
        run(cfg_of(tmp, "damaged"), resume=folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_another_models_checkpoint_is_an_error_naming_a_differing_tensor(uninterrupted, tmp_path):
    tmp, whole = uninterrupted
    cfg = cfg_of(tmp, "wider")
    cfg["model"]["set"] = {"dim": 48}
    says = r"holds another model's weights: \d+ shapes differ \(`embed.weight`"
    with pytest.raises(ValueError, match=says):
        run(cfg, resume=whole.checkpoint)


def test_a_background_save_writes_its_step_while_later_steps_train(uninterrupted, monkeypatch):
    """The step-4 checkpoint's files are written only after steps 5 and 6 have updated every
    weight in place; they hold step 4's weights and optimizer state (those of a save in the step)."""
    tmp, _ = uninterrupted
    sync = run(cfg_of(tmp, "in_step", async_save=False), on_step=lambda s, _: s == 4)
    released, real = threading.Event(), ckpt._write_single

    def write_late(root, step, snap):
        assert released.wait(timeout=60)
        return real(root, step, snap)

    monkeypatch.setattr(ckpt, "_write_single", write_late)

    def on_step(step, _):
        if step == 6:
            released.set()
        return step == 6

    late = run(cfg_of(tmp, "late"), on_step=on_step)
    assert late.losses[5] != late.losses[6]  # the weights moved after the snapshot
    a, b = sync.checkpoint, tmp / "late" / "checkpoints" / "step-000004"
    assert ckpt.is_complete(b) and load_file(str(a / "model.safetensors")).keys()
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    oa = torch.load(a / "optimizer.pt", weights_only=False)
    ob = torch.load(b / "optimizer.pt", weights_only=False)
    for name, state in oa["state"].items():
        assert all(torch.equal(v, ob["state"][name][k]) for k, v in state.items())
    assert (a / "train_state.json").read_text() == (b / "train_state.json").read_text()


def test_host_stage_reuses_its_buffers_and_copies_what_it_is_given():
    """`HostStage.copy` keeps the structure and non-tensor values, holds copies that later in-place
    updates of the source do not reach, writes into the same buffers on the next copy and
    allocates anew where a tensor's shape or dtype changed."""
    stage = ckpt.HostStage()
    w = torch.arange(6.0).view(2, 3).t()  # not contiguous: its buffer is
    state = {"w": w, "groups": [{"lr": 0.1, "step": torch.tensor(3.0)}], "pair": (torch.ones(2), "x")}
    first = stage.copy(state, ("s",))
    stage.wait()
    assert first["groups"][0]["lr"] == 0.1 and first["pair"][1] == "x" and isinstance(first["pair"], tuple)
    assert torch.equal(first["w"], w) and first["w"].is_contiguous() and first["w"] is not w
    w.add_(1.0)
    assert torch.equal(first["w"], w - 1.0)  # a copy, not a view of the live tensor
    ptr = first["w"].data_ptr()
    state["pair"] = (torch.ones(3), "x")
    second = stage.copy(state, ("s",))
    assert second["w"].data_ptr() == ptr and torch.equal(second["w"], w)
    assert second["pair"][0].shape == (3,)
