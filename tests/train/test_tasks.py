"""`data = { task = ... }` trains from `lt2dsl.tasks.build(cfg)`; a stand-in of that interface
(`batch(step, batch_size, seed) -> (input_ids, labels)`, -100 where no loss) plays the tasks room."""

from __future__ import annotations

import sys
import types

import pytest
import torch

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
