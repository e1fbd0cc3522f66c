"""The run file and the `lt2dsl distill` verb: typed sections, fixed flags, errors without tracebacks."""

from __future__ import annotations

import argparse

import pytest

from lt2dsl.cli import main
from lt2dsl.distill.cli import OPTIONS, add_arguments
from lt2dsl.distill.config import load_config, validate

from .helpers import TEXT, program, random_teacher

RUN = """
[teacher]
file = "teacher.lt2"
weights = "teacher.safetensors"
backend = "reference"

[student]
file = "{student}"
backend = "reference"

[data]
train = ["{text}"]
documents = "paragraph"
seq_len = 32

[training]
batch_size = 4
precision = "fp32"
out = "run"

[metrics]
progress = false
plot = false

[[stages]]
kind = "align"
steps = 1

[report]
baseline = false
eval_rows = 4
export_hf = false
plot = false
"""


def run_file(folder, student="s.lt2", extra="") -> str:
    path = folder / "distill.toml"
    path.write_text(RUN.format(student=student, text=TEXT) + extra)
    return str(path)


def test_paths_are_relative_to_the_run_file_and_stages_are_typed(tmp_path):
    cfg = load_config(run_file(tmp_path, extra='\n[[stages]]\nkind = "select"\n'))
    assert cfg.teacher.file == tmp_path / "teacher.lt2" and cfg.training.out == tmp_path / "run"
    assert [s.kind for s in cfg.stages] == ["align", "select"] and cfg.stages[1].keep == 0.25


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"stages": [{"kind": "algn", "steps": 1}]}, "does not match any of the expected tags"),
        ({"stages": [{"kind": "long", "steps": 1}]}, "`stages.0.seq_len`: Field required"),
        ({"stages": [{"kind": "select"}, {"kind": "select"}]}, "more than one `select`"),
        ({"teacher": {"file": "t.lt2"}}, "give `file` and `weights` (or `hf`)"),
        ({"training": {"steps": 3}}, "`training.steps`: unknown key"),
        ({"stages": []}, "`stages`"),
        (
            {"data": {"task": "state_tracking", "group": "parity", "max_stage": 2}},
            "`align` stages predict no tokens",
        ),
    ],
)
def test_bad_run_files_name_the_field(change, words):
    raw = {
        "teacher": {"file": "t.lt2", "weights": "w"},
        "student": {"file": "s.lt2"},
        "data": {"train": ["x.txt"]},
        "stages": [{"kind": "align", "steps": 1}],
    } | change
    with pytest.raises(ValueError) as e:
        validate(raw)
    assert words in str(e.value)


def test_the_command_line_is_fixed():
    p = argparse.ArgumentParser()
    add_arguments(p)
    flags = {o for a in p._actions for o in a.option_strings} - {"-h", "--help"}
    assert flags == set(OPTIONS) == {"--resume", "--out", "--seed", "--device"}


def test_cli_runs_and_reports_bad_input_without_a_traceback(tmp_path, capsys):
    random_teacher(tmp_path, "full * 2")
    program(tmp_path, "s", "gdn(expand_v=1); full")
    program(tmp_path, "bad", "gdn; full")
    assert main(["distill", run_file(tmp_path), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "report.json").is_file()
    assert main(["distill", run_file(tmp_path, student="bad.lt2")]) == 1
    err = capsys.readouterr().err
    assert "error[E1102]" in err and "bad.lt2:8:" in err and "gdn; full" in err and "Traceback" not in err
    assert main(["distill", run_file(tmp_path, extra="\n[optimizer]\nlr = 0\n")]) == 1
    assert "`optimizer.lr`" in capsys.readouterr().err
    assert main(["distill", str(tmp_path / "missing.toml")]) == 2
