"""`data = { task = ... }` trains from `lt2dsl.tasks.build(cfg)`: a stand-in of that interface
(`batch(step, batch_size, seed) -> (input_ids, labels)`, -100 where no loss), then the real
curriculum, which the trainer feeds each step's exact match and checkpoints with the run."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

import lt2dsl
from lt2dsl.tasks import build
from lt2dsl.train import run

from .helpers import config

T = 12


class Recall:
    """x_1 … x_k then the query x_1 again: only the answer after the query is scored."""

    def __init__(self, cfg: dict):
        self.cfg = cfg

    def batch(self, step: int, batch_size: int, seed: int):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        ids = torch.randint(2, self.cfg["vocab"], (batch_size, T), generator=g)
        ids[:, -2] = ids[:, 0]
        labels = torch.full_like(ids, -100)
        labels[:, -2] = ids[:, 1]  # after the query, predict what followed it
        return ids, labels


@pytest.fixture
def tasks(monkeypatch):
    seen = []
    fake = types.ModuleType("lt2dsl.tasks")
    fake.build = lambda cfg: seen.append(cfg) or Recall(cfg)
    monkeypatch.setitem(sys.modules, "lt2dsl.tasks", fake)
    return seen


def test_task_source_trains_with_masked_labels(tmp_path, tasks):
    cfg = config(tmp_path, "task", training={"steps": 3}, metrics={"eval_rows": 4})
    cfg["data"] = {"task": "recall", "vocab": 40}
    result = run(cfg)
    assert tasks[0] == {"task": "recall", "vocab": 40}
    assert sorted(result.losses) == [1, 2, 3] and 3 in result.evals
    # one labelled token per row: the loss is a mean over those, near log(vocab) at the start
    assert 2.5 < result.losses[1] < 6.0


def test_task_ids_outside_the_vocab_are_a_clear_error(tmp_path, tasks):
    cfg = config(tmp_path, "task_big", training={"steps": 1})
    cfg["data"] = {"task": "recall", "vocab": 1000}
    with pytest.raises(ValueError, match=r"token ids up to \d+, the model's vocab is 256"):
        run(cfg)


PARITY = """model parity {
  dim = 32
  vocab = 2
  heads = 1
  mlp = swiglu(hidden=64)
  gdn(neg_eigval=true, head_dim=16, expand_v=1, conv=0)
}
"""
# a low bar, so the curriculum moves within a few steps of an untrained model
CURRICULUM = {"task": "state_tracking", "group": "parity", "max_stage": 3, "window": 2, "threshold": 0.55}


def curriculum_cfg(tmp_path, out: str) -> dict:
    cfg = config(
        tmp_path,
        out,
        training={"steps": 12, "batch_size": 8},
        optimizer={"lr": 1e-2, "weight_decay": 0.0},
        scheduler={"warmup_steps": 0},
        checkpoint={"enable": True, "interval": 4, "keep_latest_k": 0},
    )
    (tmp_path / "parity.lt2").write_text(PARITY)
    cfg["model"]["file"] = str(tmp_path / "parity.lt2")
    cfg["data"] = dict(CURRICULUM)
    return cfg


class Killed(Exception):
    pass


def test_a_curriculum_advances_and_resumes_exactly(tmp_path):
    whole = run(curriculum_cfg(tmp_path, "whole"))
    rows = [r for r in whole.rows if "loss" in r]
    # the accuracy the trainer reports is the batch's exact match, from the hidden states at the
    # labelled positions: recompute batch 0's from the full logits of the initial weights
    torch.manual_seed(0)
    init = lt2dsl.compile(tmp_path / "parity.lt2", backend="reference", fuse=False)
    ids, labels = build(CURRICULUM).batch(0, 8, 0)
    right = (init(ids).argmax(-1) == labels).sum().item()
    assert rows[0]["task/accuracy"] == right / labels.numel()
    state = whole.task.state_dict()["curriculum"]
    at_4 = json.loads((tmp_path / "whole" / "checkpoints" / "step-000004" / "train_state.json").read_text())
    assert at_4["data"]["source"]["curriculum"]["stage"] > 1  # moved before the checkpoint
    assert state["stage"] > at_4["data"]["source"]["curriculum"]["stage"]  # and after it
    assert [r["task/stage"] for r in rows] == sorted(r["task/stage"] for r in rows)

    cfg = curriculum_cfg(tmp_path, "killed")

    def kill_at_7(step, _):
        if step == 7:
            raise Killed

    with pytest.raises(Killed):
        run(cfg, on_step=kill_at_7)
    resumed = run(cfg, resume=True)
    assert min(resumed.losses) == 5
    assert {s: resumed.losses[s] for s in range(5, 13)} == {s: whole.losses[s] for s in range(5, 13)}
    assert resumed.task.state_dict() == whole.task.state_dict()


def test_on_step_ends_a_run_early(tmp_path):
    cfg = curriculum_cfg(tmp_path, "early")
    cfg["checkpoint"]["enable"] = False
    result = run(cfg, on_step=lambda step, r: r.task.curriculum.stage > 1)
    stage_2 = result.task.curriculum.reached[2]
    assert sorted(result.losses) == list(range(1, stage_2 + 1)) and result.task.curriculum.stage == 2
