"""`lt2dsl eval`: a `.lt2` file plus safetensors weights in, the same numbers as the Python API out."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import lt2dsl
from lt2dsl.cli import main
from lt2dsl.tasks import evaluate

MODEL = "model m {\n  dim = 16\n  vocab = 8\n  heads = 2\n  dtype = fp32\n  gdn(expand_v=1); full\n}\n"
OTHER = "model m {\n  dim = 24\n  vocab = 8\n  heads = 2\n  dtype = fp32\n  gdn(expand_v=1); full\n}\n"


@pytest.fixture
def ckpt(tmp_path):
    torch.manual_seed(3)
    model = lt2dsl.compile(MODEL, backend="reference")
    (tmp_path / "m.lt2").write_text(MODEL)
    (tmp_path / "other.lt2").write_text(OTHER)
    (tmp_path / "bad.lt2").write_text("dim = 16\ngdnn\n")
    step = tmp_path / "step-000010"
    step.mkdir()
    save_file(model.state_dict(), str(step / "model.safetensors"))
    return tmp_path, model


def run(capsys, *argv):
    status = main([str(a) for a in argv])
    out = capsys.readouterr()
    return status, out.out, out.err


TASK = ("--task", "state_tracking", "--data", "group=s3", "--data", "length=12", "--batches", "2")


def test_eval_matches_the_python_api(ckpt, capsys):
    root, model = ckpt
    status, out, err = run(
        capsys, "eval", root / "step-000010", "--model", root / "m.lt2", *TASK, "--json", "-"
    )
    assert status == 0, err
    got = json.loads(out)
    want = evaluate(model, {"task": "state_tracking", "group": "s3", "length": 12}, batches=2).to_json()
    assert got == json.loads(json.dumps(want))
    status, out, _ = run(
        capsys,
        "eval",
        root / "step-000010/model.safetensors",
        "--model",
        root / "m.lt2",
        *TASK,
        "--json",
        root / "r.json",
    )
    assert status == 0 and "exact match on the test split" in out and "position" in out
    assert json.loads((root / "r.json").read_text()) == got


def test_eval_errors(ckpt, capsys):
    root, _ = ckpt
    weights, model = root / "step-000010", root / "m.lt2"
    status, _, err = run(capsys, "eval", root / "nope", "--model", model, *TASK)
    assert status == 2 and err.startswith("error: no weights at")
    status, _, err = run(capsys, "eval", weights, "--model", model, "--task", "mqqar")
    assert status == 2 and "`task` must be one of" in err
    status, _, err = run(capsys, "eval", weights, "--model", model, *TASK, "--data", "lenght=3")
    assert status == 2 and "lenght: unknown key" in err
    status, _, err = run(capsys, "eval", weights, "--model", root / "other.lt2", *TASK)
    assert status == 1 and "do not fit" in err and "misshapen" in err
    status, _, err = run(capsys, "eval", weights, "--model", root / "bad.lt2", *TASK)
    assert status == 1 and "error[E0101]" in err and "Traceback" not in err
    status, _, err = run(capsys, "eval", weights, "--model", model, "--task", "mqar")
    assert status == 1 and "vocab" in err  # the task's 8192 ids do not fit vocab 8
    status, _, err = run(capsys, "eval", weights, "--model", model, *TASK, "--batch-size", "0")
    assert status == 2 and "expected a positive integer, got '0'" in err
