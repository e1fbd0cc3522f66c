"""Exact-match evaluation: overall, per curriculum stage and per slice bucket, checked against
oracles that are right or wrong at known positions."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console
from torch import nn

from lt2dsl.tasks import evaluate
from lt2dsl.tasks.report import eval_table


class ParityOracle(nn.Module):
    """Right running parities before position `wrong_from`, flipped from there on."""

    def __init__(self, wrong_from: int, vocab: int = 2):
        super().__init__()
        self.wrong_from = wrong_from
        self.anchor = nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(vocab=vocab, head=True)

    def forward(self, ids):
        p = torch.cumsum(ids, 1) % 2
        p[:, self.wrong_from :] = 1 - p[:, self.wrong_from :]
        return nn.functional.one_hot(p, self.config.vocab).float() + self.anchor


def test_accuracy_by_position_bucket():
    model = ParityOracle(wrong_from=8).train()
    rep = evaluate(
        model, {"task": "state_tracking", "group": "parity", "length": 16}, batches=2, batch_size=8
    )
    assert model.training  # restored
    (v,) = rep.variants.values()
    assert rep.accuracy == v.overall.accuracy == 0.5 and v.overall.total == 2 * 8 * 16
    assert v.overall.sequence_accuracy == 0.0
    assert {b: t.accuracy for b, t in v.slices["position"].items()} == {"0-7": 1.0, "8-15": 0.0}
    js = rep.to_json()
    assert js["variants"]["n=16"]["slices"]["position"]["8-15"] == {"accuracy": 0.0, "answers": 128}
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(eval_table(rep))
    row = next(line for line in console.export_text().splitlines() if "8-15" in line)
    assert row.split("│")[2:6] == [" position ", " 8-15   ", "               0.0000 ", "     128 "]


def test_curriculum_is_scored_per_stage():
    cfg = {"task": "state_tracking", "group": "parity", "stage": 1, "max_stage": 3}
    rep = evaluate(ParityOracle(wrong_from=8), cfg, batches=1, batch_size=4)
    accs = {k: v.overall.accuracy for k, v in rep.variants.items()}
    assert accs == {"stage 1 (n=8)": 1.0, "stage 2 (n=16)": 0.5, "stage 3 (n=32)": 0.25}
    assert rep.stage_solved(0.99) == 1 and rep.stage_solved(0.5) == 2


def test_a_model_the_task_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="vocab"):
        evaluate(ParityOracle(8, vocab=2), {"task": "state_tracking", "group": "s3", "length": 8})
    with pytest.raises(ValueError, match="batches"):
        evaluate(ParityOracle(8), {"task": "state_tracking", "group": "parity", "length": 8}, batches=0)
