"""Learning-rate schedules and weight-decay groups."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from lt2dsl.train.optim import (
    OptimConfig,
    SchedulerConfig,
    build_optimizer,
    build_scheduler,
    lr_factor,
    param_groups,
)


def test_cosine_warms_up_then_decays_to_the_floor():
    cfg = SchedulerConfig(kind="cosine", warmup_steps=4, min_lr_ratio=0.1)
    f = [lr_factor(s, 20, cfg) for s in range(20)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a > b for a, b in itertools.pairwise(f[4:]))
    assert math.isclose(lr_factor(20, 20, cfg), 0.1)
    assert math.isclose(f[4 + 8], 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


@pytest.mark.parametrize(("shape", "mid"), [("linear", 0.5), ("sqrt", 1 - math.sqrt(0.5)), ("cosine", 0.5)])
def test_wsd_is_flat_then_decays_over_the_last_fraction(shape, mid):
    cfg = SchedulerConfig(kind="wsd", warmup_steps=2, decay_fraction=0.2, min_lr_ratio=0.0, decay_shape=shape)
    f = [lr_factor(s, 100, cfg) for s in range(100)]
    assert f[:2] == [0.5, 1.0] and set(f[2:80]) == {1.0}
    assert math.isclose(f[89], mid, abs_tol=1e-9) and math.isclose(f[99], 0.0, abs_tol=1e-12)


def test_scheduler_sets_the_rate_each_step():
    p = nn.Parameter(torch.zeros(2, 2))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = build_scheduler(opt, 10, SchedulerConfig(warmup_steps=2))
    rates = []
    for _ in range(4):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates[:3] == [0.5, 1.0, 1.0] and rates[3] < 1.0


def test_decay_groups_split_matrices_from_vectors_and_embeddings():
    model = nn.ModuleDict({"embed": nn.Embedding(10, 4), "proj": nn.Linear(4, 4), "norm": nn.RMSNorm(4)})
    decay, rest = param_groups(model, OptimConfig(decay_embeddings=False))
    assert {id(p) for p in decay["params"]} == {id(model["proj"].weight)}
    assert {id(p) for p in rest["params"]} == {
        id(model["embed"].weight),
        id(model["proj"].bias),
        id(model["norm"].weight),
    }
    assert rest["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    groups = build_optimizer(model, OptimConfig()).param_groups
    assert len(groups[0]["params"]) == 2  # embeddings decay by default


def test_bad_betas_are_refused():
    with pytest.raises(ValueError, match="betas"):
        OptimConfig(betas=(0.9, 1.0))
