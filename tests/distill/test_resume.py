"""A distillation run resumes: finished stages are skipped, an unfinished one continues from its
newest checkpoint and ends where an uninterrupted run ends."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from lt2dsl.distill import run

from .helpers import distill_config, program, random_teacher

STAGES = [{"kind": "align", "steps": 3}, {"kind": "kd", "steps": 4}]


class Stop(Exception):
    pass


def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path):
    teacher = random_teacher(tmp_path, "full * 2")
    student = program(tmp_path, "s", "gdn(expand_v=1); full")
    ckpt = {"enable": True, "interval": 2}
    whole = run(
        distill_config(
            tmp_path, teacher, student, STAGES, training={"out": str(tmp_path / "a")}, checkpoint=ckpt
        )
    )

    cfg = distill_config(
        tmp_path, teacher, student, STAGES, training={"out": str(tmp_path / "b")}, checkpoint=ckpt
    )

    def stop_in_kd(stage: int, step: int) -> None:
        if (stage, step) == (2, 3):
            raise Stop

    with pytest.raises(Stop):
        run(cfg, on_step=stop_in_kd)
    with pytest.raises(ValueError, match="already holds a distillation run"):
        run(cfg)
    ran = []
    resumed = run(cfg, resume=True, on_step=lambda stage, step: ran.append((stage, step)))
    assert ran == [(2, 3), (2, 4)]  # align was done; kd went on from its step-2 checkpoint
    assert resumed.stages[1].losses == whole.stages[1].losses
    a, b = load_file(str(whole.stages[1].weights)), load_file(str(resumed.stages[1].weights))
    assert all(torch.equal(a[k], b[k]) for k in a)
