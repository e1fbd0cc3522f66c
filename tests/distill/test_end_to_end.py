"""End to end at toy size: a Llama-style teacher trained by `lt2dsl train` on the test corpus,
distilled into an all-GDN student and into 25%-attention hybrids (KL-guided and random selection).

The three students share one `align` stage (the GDN run's, reused through `student.weights`) and
then run the same `kd` steps with the same seed, so they differ only in which block stays
attention. Figures are held-out means over the same rows. Measured (teacher ppl; GDN student ppl
and KL to the teacher; KL-guided hybrid; random hybrid; random-init GDN ppl), the teacher on fused
blocks (the default) and on eager ones, which round differently:

    seed 0 fused   8.97;  9.38 (KL 0.153);  9.18 (0.075);  9.21 (0.138);  20.5
    seed 0 eager   8.83;  9.22 (0.137);     8.85 (0.068);  9.27 (0.134);  20.5
    seed 1 fused   9.15;  9.89 (0.152);     9.39 (0.061);  9.79 (0.140);  20.3
    seed 1 eager   8.89;  9.34 (0.132);     8.95 (0.051);  9.22 (0.116);  20.3

The asserted ratios hold in all four with room: the hybrid's perplexity gap to the teacher is at
most 0.51 of the GDN student's (bound 0.7), its KL at most 0.50 of the GDN student's and 0.54 of
the random hybrid's (bound 0.7); every stage ends at most 0.978 of its starting held-out loss
(bound 0.99; the KL-guided hybrid's `kd` starts close to its floor).
"""

from __future__ import annotations

import json

import pytest

from lt2dsl.distill import run
from lt2dsl.train import run as train

from .helpers import data, metrics, program

LAYERS = 4
TEACHER_STEPS = 600
ALIGN, KD = {"kind": "align", "steps": 30, "lr": 1e-2}, {"kind": "kd", "steps": 30}


def _data(folder) -> dict:
    # rows run across paragraph bounds: the reference attention then runs a row at a time
    return data(folder, 64) | {"pack_documents": False}


def _teacher(root):
    """A `full * 4` model trained by the trainer; its run folder holds the final checkpoint."""
    path = program(root, "teacher", f"full * {LAYERS}")
    cfg = {
        "model": {"file": str(path), "backend": "reference"},
        "data": _data(root),
        "training": {"steps": TEACHER_STEPS, "batch_size": 8, "precision": "fp32", "out": str(root / "t")},
        # at 1e-2 the teacher leaves its early plateau by step ~200 whatever the rounding order
        # (fused or eager blocks, seeds 0 and 1); at 2e-2 that step was chaotic
        "optimizer": {"lr": 1e-2, "weight_decay": 0.0},
        "scheduler": {"warmup_steps": 10},
        "checkpoint": {"enable": True, "interval": TEACHER_STEPS},
        "metrics": metrics() | {"log_interval": 100},
    }
    result = train(cfg)
    return path, root / "t", result


def _distill(root, teacher, out: str, stages: list, weights=None, **report) -> dict:
    student = program(root, "gdn", f"gdn(expand_v=1) * {LAYERS}")
    return {
        "teacher": {"file": str(teacher[0]), "weights": str(teacher[1]), "backend": "reference"},
        "student": {"file": str(student), "backend": "reference"}
        | ({"weights": str(weights)} if weights else {}),
        "data": _data(root),
        "training": {"batch_size": 8, "precision": "fp32", "out": str(root / out), "seed": 0},
        "optimizer": {"lr": 3e-3, "weight_decay": 0.0},
        "scheduler": {"warmup_steps": 5},
        "checkpoint": {"enable": False},
        "metrics": metrics(),
        "stages": stages,
        "report": {"baseline": False, "eval_rows": 32, "export_hf": False, "plot": False} | report,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    path, weights, trained = _teacher(root)
    teacher = (path, weights)
    gdn = run(_distill(root, teacher, "gdn", [ALIGN, KD], baseline=True))
    aligned = gdn.stages[0].folder
    kl = run(_distill(root, teacher, "kl", [{"kind": "select"}, KD], aligned, plot=True))
    rand = run(
        _distill(root, teacher, "rand", [{"kind": "select", "method": "random", "seed": 0}, KD], aligned)
    )
    return {"teacher": trained, "gdn": gdn, "kl": kl, "random": rand}


def test_the_teacher_learns_and_every_stage_lowers_its_own_held_out_loss(runs):
    t = runs["teacher"].losses
    assert t[TEACHER_STEPS] < 0.5 * t[1]
    for name in ("gdn", "kl", "random"):
        for s in (s for s in runs[name].stages if s.kind != "select"):
            # before the first step and after the last, on the same held-out rows
            assert s.evals[KD["steps"]] < 0.99 * s.evals[0], (name, s.kind, s.evals)


def test_the_hybrid_is_closer_to_the_teacher_than_the_all_gdn_student(runs):
    teacher = runs["gdn"].report["heldout"]["teacher"]["perplexity"]
    gdn, hybrid = (runs[k].report["heldout"]["student"] for k in ("gdn", "kl"))
    assert runs["kl"].report["heldout"]["teacher"]["perplexity"] == teacher  # the same held-out rows
    assert abs(hybrid["perplexity"] - teacher) < 0.7 * abs(gdn["perplexity"] - teacher)
    assert hybrid["kl_to_teacher"] < 0.7 * gdn["kl_to_teacher"]
    # the distilled student beats a random-init student trained on as many tokens
    baseline = runs["gdn"].report["heldout"]["baseline"]
    assert gdn["perplexity"] < 0.8 * baseline["perplexity"]


def test_kl_guided_selection_ends_closer_to_the_teacher_than_a_random_choice(runs):
    kl, rand = runs["kl"].stages[0].selection, runs["random"].stages[0].selection
    assert len(kl["chosen"]) == len(rand["chosen"]) == 1  # 25% of 4 blocks
    assert kl["chosen"] != rand["chosen"]  # else the two runs are the same run
    top = max(kl["scores"], key=kl["scores"].get)
    assert kl["chosen"] == [top]
    final = {k: runs[k].report["heldout"]["student"]["kl_to_teacher"] for k in ("kl", "random")}
    assert final["kl"] < 0.7 * final["random"], final
    assert "full" in runs["kl"].stages[-1].student.read_text()


def test_the_report_holds_every_figure_and_its_plots(runs):
    out = runs["kl"].out
    report = json.loads((out / "report.json").read_text())
    assert [s["kind"] for s in report["stages"]] == ["select", "kd"]
    assert set(report["selection"]["scores"]) == {f"0.{i}/0:gdn" for i in range(LAYERS)}
    assert (out / "kl_ranking.png").stat().st_size > 0 and (out / "losses.png").stat().st_size > 0
    assert "teacher" in (out / "estimate.txt").read_text()
    assert set(runs["gdn"].report["heldout"]) == {"teacher", "student", "baseline"}
