"""The trainer's objective hook (`train/objective.py`): the objective's loss is what a step
minimises and logs, and what its `prepare` freezes does not train."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lt2dsl.train import run
from lt2dsl.train.build import build_model
from lt2dsl.train.config import validate
from lt2dsl.train.objective import LMObjective

from .helpers import config


class Scaled(nn.Module):
    def __init__(self, inner: nn.Module, factor: float):
        super().__init__()
        self.inner, self.factor = inner, factor

    def forward(self, input_ids, labels, cu_seqlens=None):
        return self.factor * self.inner(input_ids, labels, cu_seqlens)


class FrozenEmbedding(LMObjective):
    """Twice the LM loss, with the embedding frozen."""

    def prepare(self, model: nn.Module) -> None:
        self.model = model
        model.embed.requires_grad_(False)

    def loss_module(self, tm, chunk: int, dtype: torch.dtype) -> nn.Module:
        return Scaled(super().loss_module(tm, chunk, dtype), 2.0)


def test_an_objective_sets_the_loss_and_what_trains(tmp_path):
    plain = run(config(tmp_path, "plain", training={"steps": 2}))
    objective = FrozenEmbedding()
    cfg = config(tmp_path, "frozen", training={"steps": 2})
    scaled = run(cfg, objective=objective)
    assert scaled.losses[1] == pytest.approx(2 * plain.losses[1], rel=1e-6)
    torch.manual_seed(0)
    start = build_model(validate(cfg))
    trained = objective.model.state_dict()
    assert torch.equal(trained["embed.weight"], start.state_dict()["embed.weight"])
    assert not torch.equal(
        trained["blocks.0.mlp.up_proj.weight"], start.state_dict()["blocks.0.mlp.up_proj.weight"]
    )


class NoPerplexity(FrozenEmbedding):
    """An objective whose loss is not a next-token cross-entropy (twice one is not)."""

    perplexity = False


def eval_rows(folder) -> list[dict]:
    import json

    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "eval/loss" in row]


def test_a_perplexity_is_reported_for_the_next_token_loss_only(tmp_path, capsys):
    """exp(held-out loss) is a perplexity of the LM objective; of another objective's loss (an
    alignment's error, a KL mix) it is not one, and neither the JSONL nor the console says it is."""
    run(config(tmp_path, "lm", training={"steps": 2}, metrics={"eval_interval": 2, "progress": True}))
    lm = eval_rows(tmp_path / "lm")
    assert lm and all(r["eval/perplexity"] > 1 for r in lm)
    assert " ppl " in capsys.readouterr().out
    cfg = config(tmp_path, "other", training={"steps": 2}, metrics={"eval_interval": 2, "progress": True})
    run(cfg, objective=NoPerplexity())
    other = eval_rows(tmp_path / "other")
    assert other and not any("eval/perplexity" in r for r in other)
    printed = capsys.readouterr().out
    assert "eval loss" in printed and " ppl " not in printed
