"""Checkpoints: kill-and-resume reproduces the uninterrupted losses exactly (CPU, fp32); a crash
during a save never leaves a loadable half-written checkpoint; `keep_latest_k` prunes."""

from __future__ import annotations

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


def cfg_of(tmp_path, out: str) -> dict:
    return config(
        tmp_path,
        out,
        training={"steps": 10, "grad_accum": 2},
        checkpoint={"enable": True, "interval": 4, "keep_latest_k": 2},
        metrics={"eval_interval": 5},
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    return tmp, run(cfg_of(tmp, "whole"))


def test_kill_and_resume_reproduce_the_losses_exactly(uninterrupted):
    tmp, whole = uninterrupted
    cfg = cfg_of(tmp, "killed")
    with pytest.raises(Killed):
        run(cfg, on_step=kill_at(7))
    resumed = run(cfg, resume=True)
    assert min(resumed.losses) == 5  # continued from the step-4 checkpoint
    assert {s: resumed.losses[s] for s in range(5, 11)} == {s: whole.losses[s] for s in range(5, 11)}
    assert resumed.evals == whole.evals
    root = tmp / "killed" / "checkpoints"
    assert [p.name for p in ckpt.complete(root)] == ["step-000008", "step-000010"]  # keep_latest_k = 2


def test_a_crash_during_a_save_leaves_the_previous_checkpoint(uninterrupted, monkeypatch):
    tmp, whole = uninterrupted
    cfg = cfg_of(tmp, "crashed")
    real = ckpt.write_index

    def crash_on_step_8(folder, weights):
        if folder.name.startswith("step-000008"):
            raise Killed  # the process dies after the weights, before the index
        real(folder, weights)

    monkeypatch.setattr(ckpt, "write_index", crash_on_step_8)
    with pytest.raises(Killed):
        run(cfg)
    root = tmp / "crashed" / "checkpoints"
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
