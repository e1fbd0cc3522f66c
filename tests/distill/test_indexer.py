"""A GDN+DSA student's lightning indexer in the distillation stages: in `align`, `hidden` and `kd`
its KL to the main attention is part of the stage's objective (the only thing that trains
`idx_*`), recorded once per `dsa` application of each training forward and cleared by `pop()`."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from lt2dsl.distill.config import validate
from lt2dsl.distill.objectives import StageObjective
from lt2dsl.distill.pipeline import train_config
from lt2dsl.train import indexer
from lt2dsl.train import run as train
from lt2dsl.train.loop import read_metrics
from lt2dsl.train.parallel import TrainModel

from .helpers import compiled, distill_config, program, random_teacher

STUDENT = "gdn(expand_v=1); dsa(topk=4, index_heads=1, index_dim=8)"


def _pair(tmp_path):
    teacher_file, weights = random_teacher(tmp_path, "full * 2")
    teacher = compiled(teacher_file)
    teacher.load_state_dict(load_file(str(weights)))
    return teacher, program(tmp_path, "s", STUDENT)


def _teacher_mixer_input(teacher, ids: torch.Tensor) -> torch.Tensor:
    """What the teacher's block 1 attention reads (its normed input) on `ids`."""
    seen = []
    handle = teacher.blocks[1].mixers[0].register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        TrainModel(teacher)(ids)
    handle.remove()
    return seen[0]


@pytest.mark.parametrize("kind", ["align", "hidden", "kd"])
def test_each_stage_records_and_trains_the_indexer_kl_once_per_forward(tmp_path, kind):
    teacher, student_file = _pair(tmp_path)
    objective = StageObjective(kind, teacher, {"align": "mixers", "hidden": "blocks", "kd": "all"}[kind])
    student = compiled(student_file)
    objective.prepare(student)  # the teacher's weights: block 1's norm and q/k/v are the teacher's
    tm = TrainModel(student)
    tm.indexer = indexer.attach(student, 1.0, "selected", grad_accum=1)
    fwd = objective.loss_module(tm, 64, torch.float32)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    layer = student.blocks[1].mixers[0]
    with torch.no_grad():
        expected = layer.indexer_loss(_teacher_mixer_input(teacher, ids), sparse=True, reduction="mean")
    for _ in range(2):  # a second forward neither accumulates nor loses the first one's value
        fwd(ids, torch.roll(ids, -1, 1)).backward()
        assert tm.indexer.values == []
        total, count = tm.indexer.pop()
        assert count == 1, (kind, count)  # one application of the one dsa layer
        if kind != "kd":  # the student's block 1 reads the teacher's residual stream
            torch.testing.assert_close(total, float(expected), rtol=1e-5, atol=1e-7)
        assert total > 0
    assert tm.indexer.pop() == (0.0, 0)
    for name in ("idx_q", "idx_k", "idx_w"):
        grad = getattr(layer, name).weight.grad
        assert grad is not None and grad.abs().max() > 0, (kind, name)
    tm.eval()  # evaluation forwards record nothing
    with torch.no_grad():
        fwd(ids, ids)
    assert tm.indexer.pop() == (0.0, 0)


def test_align_logs_the_indexer_loss_and_trains_the_indexer(tmp_path):
    teacher, student_file = _pair(tmp_path)
    stages = [{"kind": "align", "steps": 2}]
    cfg = validate(distill_config(tmp_path, (student_file, student_file), student_file, stages))
    objective = StageObjective("align", teacher, "mixers")
    result = train(train_config(cfg, student_file, tmp_path / "align", steps=2, lr=1e-2), objective=objective)
    rows = [r for r in read_metrics(tmp_path / "align") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["indexer_loss"] > 0 for r in rows), rows
    start = compiled(student_file)
    objective.prepare(start)
    after = result.model.blocks[1].mixers[0].idx_q.weight
    assert not torch.equal(start.blocks[1].mixers[0].idx_q.weight, after.detach().cpu())
