"""A tiny model learns parity at n = 16 through the trainer (the issue's CI criterion), and the
same budget with its mixer frozen does not: the accuracy bar is one a non-learner cannot pass.

One gated DeltaNet block at dim 32 with negative eigenvalues (β ∈ (0, 2), so a token can flip the
state's sign: parity needs it) runs the parity curriculum from n = 8 to n = 16 on the CPU with
`lt2dsl.train.run`, which feeds the curriculum each step's exact match; the run ends once the
curriculum is solved.
"""

from __future__ import annotations

import pytest

from lt2dsl.tasks import evaluate
from lt2dsl.train import run

MODEL = """model parity {
  dim = 32
  vocab = 2
  heads = 1
  dtype = fp32
  mlp = swiglu(hidden=64)
  gdn(neg_eigval=true, head_dim=16, expand_v=1, conv=0)
}
"""
TASK = {"task": "state_tracking", "group": "parity", "stage": 1, "max_stage": 2, "window": 10}
STEPS = 200


def trained(tmp_path, frozen: bool):
    (tmp_path / "parity.lt2").write_text(MODEL)
    cfg = {
        "model": {
            "file": str(tmp_path / "parity.lt2"),
            "backend": "reference",
            "freeze": ["blocks.0.mixers.*"] if frozen else [],
        },
        "data": TASK,
        "training": {"steps": STEPS, "batch_size": 32, "precision": "fp32", "out": str(tmp_path / "out")},
        "optimizer": {"lr": 3e-3, "weight_decay": 0.0},
        "scheduler": {"warmup_steps": 10},
        "checkpoint": {"enable": False},
        "metrics": {"log_interval": 25, "eval_rows": 32, "progress": False, "plot": False},
    }
    result = run(cfg, on_step=lambda step, r: r.task.curriculum.solved)
    at_16 = evaluate(result.model, {**TASK, "length": 16}, batches=4, batch_size=64).accuracy
    return result, at_16


def test_a_tiny_gdn_learns_parity_at_16(tmp_path):
    result, acc = trained(tmp_path, frozen=False)
    curriculum = result.task.curriculum
    assert curriculum.solved and curriculum.stage == 2  # stopped early, both stages done
    assert max(result.losses) < STEPS
    assert acc >= 0.99


def test_with_its_mixer_frozen_it_does_not(tmp_path):
    result, acc = trained(tmp_path, frozen=True)
    assert not result.task.curriculum.solved and max(result.losses) == STEPS
    assert acc < 0.8
    mixer = dict(result.model.named_parameters())["blocks.0.mixers.0.A_log"]
    assert not mixer.requires_grad


def test_freeze_patterns_must_match(tmp_path):
    (tmp_path / "parity.lt2").write_text(MODEL)
    cfg = {
        "model": {"file": str(tmp_path / "parity.lt2"), "freeze": ["blocks.*.mixers.*.w"]},
        "data": TASK,
        "training": {"steps": 1, "out": str(tmp_path / "out")},
    }
    with pytest.raises(ValueError, match=r"'blocks\.\*\.mixers\.\*\.w' matches no parameter"):
        run(cfg)
