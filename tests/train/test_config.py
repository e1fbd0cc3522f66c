"""The run file: sections, field errors that name the field, the frozen command line."""

from __future__ import annotations

import argparse

import pytest

from lt2dsl.cli import main
from lt2dsl.train.cli import OPTIONS, add_arguments
from lt2dsl.train.config import load_config, validate
from lt2dsl.train.data import DataConfig, TaskDataConfig

from .helpers import TEXT, model_file

RUN = """
[model]
file = "model.lt2"
set = {{ dim = 48 }}

[data]
train = ["{text}"]
documents = "paragraph"
seq_len = 32

[training]
steps = {steps}
batch_size = 2
precision = "fp32"
out = "out"

[metrics]
progress = false
plot = false
log_interval = 1
"""


def run_file(tmp_path, steps: int = 2, extra: str = ""):
    model_file(tmp_path)
    path = tmp_path / "run.toml"
    path.write_text(RUN.format(text=TEXT, steps=steps) + extra)
    return path


def test_toml_sections_and_relative_paths(tmp_path):
    cfg = load_config(run_file(tmp_path), {"training.steps": 7})
    assert cfg.model.file == tmp_path / "model.lt2" and cfg.training.out == tmp_path / "out"
    assert cfg.model.set == {"dim": 48} and cfg.training.steps == 7
    assert isinstance(cfg.data, DataConfig) and cfg.data.seq_len == 32
    assert cfg.optimizer.lr == 3e-4 and cfg.scheduler.kind == "cosine"  # defaults


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"training": {"steps": 0}}, "`training.steps`: Input should be greater than 0"),
        ({"training": {"steps": 1, "batchsize": 4}}, "`training.batchsize`: unknown key"),
        ({"training": {"steps": 1}, "optimizer": {"lr": -1}}, "`optimizer.lr`"),
        ({"training": {"steps": 1}, "scheduler": {"kind": "linear"}}, "`scheduler.kind`"),
        ({"training": {"steps": 1, "precision": "fp8"}}, "`training.precision`"),
    ],
)
def test_a_bad_field_is_named(patch, message):
    raw = {"model": {"file": "m.lt2"}, "data": {"train": ["a.txt"]}, **patch}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(raw)


def test_data_is_files_or_a_task():
    raw = {"model": {"file": "m.lt2"}, "training": {"steps": 1}}
    task = validate({**raw, "data": {"task": "mqar", "num_kv_pairs": 4}}).data
    assert isinstance(task, TaskDataConfig) and task.task_dict() == {"task": "mqar", "num_kv_pairs": 4}
    with pytest.raises(ValueError, match=r"`data.seq_lenn`: unknown key"):
        validate({**raw, "data": {"train": ["a.txt"], "seq_lenn": 3}})


def test_yaml_run_files(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {file: m.lt2}\ndata: {train: [a.txt]}\ntraining: {steps: 3}\n")
    if not _has_yaml():
        with pytest.raises(ValueError, match="PyYAML"):
            load_config(path)
        return
    cfg = load_config(path)
    assert cfg.training.steps == 3 and cfg.model.file == tmp_path / "m.lt2"


def _has_yaml() -> bool:
    try:
        import yaml  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def test_the_command_line_is_frozen():
    """Everything else belongs in the run file (torchtitan's `test_no_new_cli_options`)."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    flags = {o for a in p._actions for o in a.option_strings} - {"-h", "--help"}
    assert flags == set(OPTIONS) == {"--resume", "--steps", "--out", "--seed", "--device"}


def test_cli_trains_and_reports_bad_input_without_a_traceback(tmp_path, capsys):
    path = run_file(tmp_path)
    assert main(["train", str(path), "--out", str(tmp_path / "cli_out"), "--steps", "1"]) == 0
    assert (tmp_path / "cli_out" / "metrics.jsonl").is_file()
    bad = run_file(tmp_path, extra="\n[optimizer]\nlr = 0\n")
    assert main(["train", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "`optimizer.lr`" in err and "Traceback" not in err
    assert main(["train", str(tmp_path / "missing.toml")]) == 2
