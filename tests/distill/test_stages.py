"""The stages as trainer objectives: what trains, what stays, and that each lowers its loss; a looped
teacher gives a looped student."""

from __future__ import annotations

import json
import re

import torch
from safetensors.torch import load_file

from bench.hf_layouts import ouro_config, ouro_shapes, random_state, write_checkpoint
from lt2dsl.distill import init_student, run
from lt2dsl.distill.config import validate
from lt2dsl.distill.objectives import StageObjective
from lt2dsl.distill.pipeline import train_config
from lt2dsl.hf.importer import import_checkpoint
from lt2dsl.train import run as train

from .helpers import compiled, data, distill_config, program, random_teacher


def changed(a: dict, b: dict) -> set[str]:
    return {k for k in a if not torch.equal(a[k], b[k])}


def test_align_trains_only_the_replaced_mixers_and_leaves_the_teacher_unchanged(tmp_path):
    teacher_file, weights = random_teacher(tmp_path, "full * 3")
    teacher = compiled(teacher_file)
    teacher.load_state_dict(load_file(str(weights)))
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_file = program(tmp_path, "s", "gdn(expand_v=1); full; gdn(expand_v=1)")
    cfg = validate(
        distill_config(tmp_path, (teacher_file, weights), student_file, [{"kind": "align", "steps": 6}])
    )
    objective = StageObjective("align", teacher, "mixers")
    result = train(train_config(cfg, student_file, tmp_path / "align", steps=6, lr=1e-2), objective=objective)
    assert result.losses[6] < 0.9 * result.losses[1], result.losses
    assert not changed(teacher_before, teacher.state_dict())
    start = compiled(student_file)
    init_student(teacher, start)
    moved = changed(start.state_dict(), objective.model.state_dict())
    assert moved and all(k.startswith(("blocks.0.mixers.", "blocks.2.mixers.")) for k in moved), moved


def test_hidden_and_long_stages_lower_their_losses_and_a_looped_teacher_gives_a_looped_student(tmp_path):
    teacher = random_teacher(tmp_path, "loop T=2 < full; full >")
    student = program(tmp_path, "s", "loop T=2 < gdn(expand_v=1); full >")
    stages = [
        {"kind": "hidden", "steps": 5, "lr": 1e-2},
        {"kind": "kd", "steps": 5, "lr": 1e-2},
        {"kind": "long", "steps": 5, "seq_len": 128, "lr": 1e-2},
    ]
    result = run(distill_config(tmp_path, teacher, student, stages))
    for s in result.stages:
        assert s.losses[5] < s.losses[1], (s.kind, s.losses)
    final = result.stages[-1].student.read_text()
    assert "loop T=2 < gdn(expand_v=1); full >" in final
    weights = load_file(str(result.stages[-1].weights))
    assert {k.split(".")[1] for k in weights if k.startswith("blocks.")} == {"0", "1"}  # shared, not unrolled
    heldout = result.report["heldout"]
    assert heldout["student"]["kl_to_teacher"] > 0 and heldout["teacher"]["kl_to_teacher"] == 0


def test_an_imported_looped_checkpoint_is_a_teacher(tmp_path):
    """Ouro's layout (the LT2 paper's teacher, shrunk): the `lt2dsl import` of its folder teaches a
    GDN student written over the imported program, which stays looped with its blocks shared."""
    cfg = ouro_config(vocab_size=256)
    root = write_checkpoint(tmp_path / "ouro", cfg, random_state(ouro_shapes(cfg)))
    text = import_checkpoint(root).text
    assert "loop T=3" in text and "let attn = full(" in text
    student = tmp_path / "student.lt2"
    student.write_text(re.sub(r"let attn = full\([^)]*\)", "let attn = gdn(expand_v=1)", text))
    stages = [{"kind": "align", "steps": 4, "lr": 1e-2}]
    run_cfg = distill_config(tmp_path, (tmp_path, tmp_path), student, stages, data=data(tmp_path, 32))
    run_cfg["teacher"] = {"hf": str(root), "backend": "reference"}
    (align,) = run(run_cfg).stages
    assert align.evals[4] < align.evals[0], align.evals
    assert "loop T=3" in align.student.read_text()
    weights = load_file(str(align.weights))
    assert {k.split(".")[1] for k in weights if k.startswith("blocks.")} == {"0", "1"}


def test_a_kd_stage_feeds_a_curriculum_task_the_students_hits(tmp_path):
    """A task source that observes asks the loss for (loss, hits); `kd` answers with the student's
    argmax hits, and the curriculum reports an accuracy every step."""
    teacher = random_teacher(tmp_path, "full * 2")
    student = program(tmp_path, "s", "gdn(expand_v=1); full")
    task = {"task": "state_tracking", "group": "parity", "max_stage": 2, "window": 2, "threshold": 0.55}
    cfg = distill_config(tmp_path, teacher, student, [{"kind": "kd", "steps": 2}])
    cfg["data"] = task
    (stage,) = run(cfg).stages
    assert set(stage.losses) == {1, 2}
    lines = (stage.folder / "metrics.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if "task/accuracy" in r]
    assert len(rows) == 2 and all(0.0 <= r["task/accuracy"] <= 1.0 for r in rows), rows
