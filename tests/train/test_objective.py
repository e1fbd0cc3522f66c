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
