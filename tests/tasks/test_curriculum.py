"""The length curriculum: stage k ↔ n = 2^(k+2), advancing on the threshold, resumable exactly."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.tasks import build
from lt2dsl.tasks.curriculum import Curriculum, stage_length

TABLE = {"task": "state_tracking", "group": "s5", "stage": 1, "max_stage": 3, "threshold": 0.9, "window": 3}


def test_stage_lengths():
    assert [stage_length(k) for k in (-1, 0, 1, 2, 3, 4, 5)] == [2, 4, 8, 16, 32, 64, 128]
    for bad in (-2, 15, 1.0, True):
        with pytest.raises(ValueError):
            stage_length(bad)


def test_advances_on_the_window_mean_then_solves():
    c = Curriculum(start=1, last=2, threshold=0.9, window=3)
    assert not c.update(0, 1.0) and not c.update(1, 1.0)
    assert not c.update(2, 0.6)  # mean 0.87 < 0.9
    assert not c.update(3, 1.0) and not c.update(4, 1.0)  # the 0.6 is still in the window
    assert c.update(5, 1.0) and c.stage == 2 and c.reached == {1: 0, 2: 6}
    assert c.highest_solved == 1 and not c.solved
    assert not c.update(6, 0.95) and not c.update(7, 0.95)  # the window starts over
    assert c.update(8, 0.95) and c.stage == 2 and c.solved and c.highest_solved == 2
    assert not c.update(9, 1.0)  # solved: nothing changes any more


def test_source_follows_the_stage():
    src = build(TABLE)
    assert src.seq_len == 32 and src.batch(0, 2)[0].shape == (2, 8)
    for step in range(3):
        assert src.observe(step, 16, 16) == 1.0
    assert src.curriculum.stage == 2 and src.batch(3, 2)[0].shape == (2, 16)


def test_state_dict_resumes_the_same_stream():
    a = build(TABLE)
    for step, acc in enumerate([1.0, 1.0, 1.0, 0.5]):  # stage 2 after step 2, one report kept
        a.curriculum.update(step, acc)
    b = build(TABLE)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict() and b.curriculum.stage == a.curriculum.stage == 2
    assert torch.equal(a.batch(9, 4, 1)[0], b.batch(9, 4, 1)[0])
    for src in (a, b):  # the same reports move both the same way
        src.observe(4, 0, 32)
    assert a.state_dict() == b.state_dict() and a.state_dict()["curriculum"]["reports"] == [0.5, 0.0]
    with pytest.raises(ValueError, match="outside stages"):
        b.curriculum.load_state_dict({**a.state_dict()["curriculum"], "stage": 9})
    with pytest.raises(ValueError, match="not a curriculum state"):
        b.curriculum.load_state_dict({"stage": 1})


def test_fixed_length_has_no_curriculum():
    src = build({"task": "state_tracking", "group": "parity", "length": 20})
    assert src.curriculum is None and src.seq_len == 20
    assert src.observes and not src.solved  # the threshold (0.99) still judges the fixed n


def test_a_curriculum_can_start_below_stage_1_with_the_same_numbering():
    src = build({**TABLE, "stage": -1, "window": 1})
    assert src.batch(0, 2)[0].shape == (2, 2)
    src.observe(0, 2, 2)
    assert src.curriculum.stage == 0 and src.batch(1, 2)[0].shape == (2, 4)
    names = list(src.cfg.eval_variants())
    assert names == ["stage -1 (n=2)", "stage 0 (n=4)", "stage 1 (n=8)", "stage 2 (n=16)", "stage 3 (n=32)"]


def test_a_threshold_solves_a_task_without_a_curriculum_and_resumes():
    cfg = {"task": "copy", "length": 4, "vocab": 5}
    assert not build(cfg).observes  # no threshold: trained for all its steps
    a = build({**cfg, "threshold": 0.9, "window": 3})
    assert a.observes and a.batch(0, 2)[0].shape == (2, 8)  # the generator does not see the controls
    for step, right in enumerate([4, 8, 8]):  # mean 0.83
        a.observe(step, right, 8)
    assert not a.solved
    b = build({**cfg, "threshold": 0.9, "window": 3})
    b.load_state_dict(a.state_dict())
    for src in (a, b):
        src.observe(3, 8, 8)  # the 0.5 leaves the window: mean 1.0
        assert src.solved
    assert a.state_dict() == b.state_dict() == {"until": {"reports": [1.0, 1.0, 1.0], "solved": True}}
    with pytest.raises(ValueError, match="not a threshold state"):
        b.load_state_dict({"until": {"reports": 3}})


NIAH = {"task": "niah", "context": 256, "start_context": 64, "num_needles": 2, "num_queries": 2,
        "threshold": 0.9, "window": 2}  # fmt: skip


def test_niah_follows_a_context_curriculum_and_is_scored_at_its_context():
    src = build(NIAH)
    assert src.seq_len == 256 and src.batch(0, 2)[0].shape == (2, 64)
    for step in range(2):
        src.observe(step, 8, 8)
    assert src.curriculum.stage == 5 and src.batch(2, 2)[0].shape == (2, 128)
    for step in range(2, 4):
        src.observe(step, 8, 8)
    for step in range(4, 6):
        src.observe(step, 8, 8)
    assert src.solved and src.curriculum.stage == 6
    (variant,) = src.cfg.eval_variants().values()
    assert variant.context == 256 and variant.start_context is None
    fixed = build({**NIAH, "start_context": None})
    assert fixed.curriculum is None and fixed.batch(0, 2)[0].shape == (2, 256)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"start_context": 48}, "power of two"),
        ({"start_context": 512}, "past context"),
        ({"threshold": None}, "threshold"),
        ({"start_context": 16}, "cannot hold"),
        ({"context": 2**17}, "curriculum stage"),
    ],
)
def test_niah_curricula_that_cannot_run_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        build({**NIAH, **change})


def test_a_niah_curriculum_reports_its_stage_beside_each_evaluation():
    from lt2dsl.tasks.experiment_config import DataEntry

    entry = DataEntry.model_validate({"name": "niah", **NIAH, "eval": [{"context": 512}]})
    assert entry.metric_names() == ["niah/accuracy", "niah/context=512/accuracy", "niah/stage", "niah/solved"]
    assert [t.eval_variants()[""].context for t in entry.eval_tasks().values()] == [256, 512]
