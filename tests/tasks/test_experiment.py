"""The claim experiments: every config loads and names real metrics, every model compiles, the
models of one experiment have equal parameters and fit its tasks; the runner end to end on a
two-step smoke experiment (the real ones need a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lt2dsl
from lt2dsl.cli import main as lt2dsl_main
from lt2dsl.tasks.experiment import check_equal_params, main
from lt2dsl.tasks.experiment_config import load_experiment

FOLDER = Path(__file__).parents[2] / "examples" / "experiments"
CONFIGS = sorted(FOLDER.glob("*.toml"))


def test_the_three_claims_have_configs():
    assert [p.stem for p in CONFIGS] == ["a_state_tracking", "b_recall", "c_copy"]


def test_every_model_compiles(capsys):
    files = sorted(FOLDER.glob("*.lt2"))
    assert lt2dsl_main(["check", *map(str, files)]) == 0, capsys.readouterr().err
    used = {(FOLDER / r.model).resolve() for p in CONFIGS for r in load_experiment(p)[0].runs}
    assert used == {f.resolve() for f in files}  # no model without a run, no run without a model


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_models_have_equal_parameters_and_fit_the_tasks(path):
    exp, root = load_experiment(path)
    counts = check_equal_params(exp, root)
    assert len(counts) == len(exp.runs) and min(counts.values()) > 1_000_000  # a few million
    for run in exp.runs:
        model = lt2dsl.compile(root / run.model, device="meta", **run.overrides)
        for data in exp.data:
            for task in data.eval_tasks().values():
                assert model.config.vocab >= task.vocab_size
                assert model.max_len is None or model.max_len >= task.seq_len
                assert model.config.max_len >= task.seq_len


SMOKE = """
name = "smoke"
claim = "a trainable mixer beats a frozen one"
seeds = [0, 1]
metrics = ["parity/accuracy", "parity/stage"]
equal_params = 0.0
[training]
steps = 3
batch_size = 4
eval_batches = 1
eval_batch_size = 4
log_every = 1
backend = "reference"
[[data]]
name = "parity"
task = "state_tracking"
group = "parity"
max_stage = 2
eval = [{ length = 24 }]
[[runs]]
name = "gdn"
model = "m.lt2"
[[runs]]
name = "gdn frozen"
model = "m.lt2"
freeze = ["blocks.?.mixers.*"]
[[checks]]
says = "training the mixer helps"
metric = "parity/accuracy"
kind = "greater"
run = "gdn"
than = "gdn frozen"
[[checks]]
says = "the frozen one stays below 0.99"
metric = "parity/accuracy"
kind = "at_most"
run = "gdn frozen"
value = 0.99
"""
MODEL = "model m {\n  dim = 16\n  vocab = 2\n  heads = 1\n  dtype = fp32\n  loop T=2 < gdn(expand_v=1) >\n}\n"


def test_the_runner_end_to_end(tmp_path, capsys):
    (tmp_path / "smoke.toml").write_text(SMOKE)
    (tmp_path / "m.lt2").write_text(MODEL)
    out = tmp_path / "results"
    argv = [str(tmp_path / "smoke.toml"), "--out", str(out), "--device", "cpu"]
    assert main(argv) == 0, capsys.readouterr().err
    runs = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert runs == [f"gdn{f}--parity--seed{s}.json" for f in ("", "_frozen") for s in (0, 1)]
    one = json.loads((out / "runs" / "gdn--parity--seed0.json").read_text())
    cfg = one["config"]  # the trainer's config of the run, which lt2dsl.train validates
    assert {"model", "data", "optimizer", "scheduler", "training"} <= set(cfg)
    assert cfg["model"]["freeze"] == [] and cfg["data"]["task"] == "state_tracking"
    assert cfg["training"]["seed"] == 0 and cfg["scheduler"]["kind"] == "cosine"
    assert [r["step"] for r in one["history"]] == [1, 2, 3] and "task/stage" in one["history"][0]
    exp, _ = load_experiment(tmp_path / "smoke.toml")
    assert set(one["metrics"]) == set(exp.data[0].metric_names())
    assert "parity/length=24/accuracy" in one["metrics"] and len(one["history"]) == 3
    summary = json.loads((out / "results.json").read_text())
    acc = summary["runs"]["gdn"]["metrics"]["parity/accuracy"]
    assert acc["n"] == 2 and acc["mean"] == pytest.approx(sum(acc["values"].values()) / 2)
    assert [c["verdict"] in ("agrees", "disagrees", "within noise") for c in summary["checks"]] == [
        True,
        True,
    ]
    md = (out / "results.md").read_text()
    assert "| gdn frozen |" in md and "training the mixer helps" in md
    assert summary["devices"] == ["cpu"] and "Trained on: cpu." in md
    assert summary["runs"]["gdn"]["steps"] == {"mean": 3.0, "std": 0.0, "n": 2}
    assert "| run | params | steps |" in md and "| gdn | " in md
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"
    stamp = (out / "runs" / "gdn--parity--seed0.json").stat().st_mtime_ns
    assert main([*argv, "--runs", "gdn"]) == 0  # done already: nothing retrains
    assert (out / "runs" / "gdn--parity--seed0.json").stat().st_mtime_ns == stamp
    capsys.readouterr()
    assert main([*argv, "--runs", "gdm"]) == 1 and "unknown runs" in capsys.readouterr().err


def test_parallel_trainings_equal_the_sequential_ones_and_a_failure_is_reported(tmp_path, capsys):
    """`--jobs 2`: one child process per (run, seed), the same result files and metrics as one
    process training them in turn, one summary; a child that fails makes the exit status 1 and is
    named with its log."""
    (tmp_path / "smoke.toml").write_text(SMOKE)
    (tmp_path / "m.lt2").write_text(MODEL)
    argv = [str(tmp_path / "smoke.toml"), "--device", "cpu", "--seeds", "0"]
    assert main([*argv, "--out", str(tmp_path / "seq")]) == 0, capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "par"), "--jobs", "2"]) == 0, capsys.readouterr().err
    for name in ("gdn--parity--seed0.json", "gdn_frozen--parity--seed0.json"):
        seq, par = (json.loads((tmp_path / d / "runs" / name).read_text()) for d in ("seq", "par"))
        losses = [[(r["step"], r["loss"], r["grad_norm"]) for r in x["history"]] for x in (seq, par)]
        assert par["metrics"] == seq["metrics"] and losses[0] == losses[1]
    assert sorted(p.name for p in (tmp_path / "par" / "logs").glob("*.log")) == [
        "gdn--seed0.log",
        "gdn_frozen--seed0.log",
    ]
    assert json.loads((tmp_path / "par" / "results.json").read_text())["runs"].keys() == {"gdn", "gdn frozen"}
    # a freeze pattern that matches nothing: found by the child's trainer, not by the parent
    (tmp_path / "smoke.toml").write_text(SMOKE.replace('"blocks.?.mixers.*"', '"nothing.*"'))
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "bad"), "--jobs", "2"]) == 1
    err = capsys.readouterr().err
    assert "gdn frozen seed 0 exited with 1" in err and "gdn_frozen--seed0.log" in err
    assert "matches no parameter" in (tmp_path / "bad" / "logs" / "gdn_frozen--seed0.log").read_text()


def test_bad_experiment_files_name_the_problem(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(
        SMOKE.replace(
            'metric = "parity/accuracy"\nkind = "greater"', 'metric = "parity/acc"\nkind = "greater"'
        )
    )
    with pytest.raises(ValueError, match="'parity/acc' is not one the data entries report"):
        load_experiment(path)
    path.write_text(SMOKE.replace('than = "gdn frozen"', 'than = "gdn froze"'))
    with pytest.raises(ValueError, match="names run 'gdn froze'"):
        load_experiment(path)


def test_a_deadline_leaves_a_summary_naming_what_is_missing_and_one_archive(tmp_path, capsys):
    """In one process and with children: trainings not done at the deadline leave no result file;
    the summary and `results.md` list every missing (run, data, seed), and `--archive` packs the
    folder into one file. The same command without a deadline then trains just what is missing."""
    import tarfile

    (tmp_path / "smoke.toml").write_text(SMOKE)
    (tmp_path / "m.lt2").write_text(MODEL)
    out, archive = tmp_path / "out", tmp_path / "out.tgz"
    argv = [str(tmp_path / "smoke.toml"), "--out", str(out), "--device", "cpu"]
    for jobs in ("1", "2"):
        assert main([*argv, "--jobs", jobs, "--deadline", "0.01", "--archive", str(archive)]) == 0
        err = capsys.readouterr().err
        assert "stopped at the deadline: gdn seed 0, gdn seed 1, gdn frozen seed 0" in err
        assert "missing 4 of 4 trainings: gdn · parity · seed 0" in err
        summary = json.loads((out / "results.json").read_text())
        assert len(summary["missing"]) == 4 and not list((out / "runs").glob("*.json"))
        assert {c["verdict"] for c in summary["checks"]} == {"not run"}
        assert "Incomplete: 4 of 4 trainings" in (out / "results.md").read_text()
        with tarfile.open(archive) as tar:
            assert {"out/results.json", "out/results.md", "out/results.png"} <= set(tar.getnames())
    assert main([*argv, "--seeds", "1", "--archive", str(archive)]) == 0, capsys.readouterr().err
    missing = json.loads((out / "results.json").read_text())["missing"]
    assert [(m["run"], m["seed"]) for m in missing] == [("gdn", 0), ("gdn frozen", 0)]
    with tarfile.open(archive) as tar:
        assert "out/runs/gdn--parity--seed1.json" in tar.getnames()


def test_children_running_at_the_deadline_are_stopped(tmp_path, monkeypatch):
    """`run_parallel` stops the children still running at the deadline (here: sleeping ones) and
    names their pairs, running first, then those it never started."""
    import argparse
    import sys
    import time

    from rich.progress import Progress

    from lt2dsl.tasks import jobs
    from lt2dsl.tasks.experiment_config import RunConfig

    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    monkeypatch.setattr(jobs, "child_command", lambda args, out, threads: sleeper)
    started, start = [], jobs._start
    monkeypatch.setattr(jobs, "_start", lambda *a: started.append(start(*a)) or started[-1])
    runs = [RunConfig(name=n, model="m.lt2") for n in ("a", "b")]
    units = [(runs[0], 0), (runs[1], 0), (runs[1], 1)]
    t0 = time.monotonic()
    with Progress(disable=True) as progress:
        outcome = jobs.run_parallel(argparse.Namespace(jobs=2), units, tmp_path, progress, t0 + 1.0)
    assert outcome.cut == [("a", 0), ("b", 0), ("b", 1)] and outcome.failed == []
    assert time.monotonic() - t0 < 1.0 + jobs.GRACE_S + 5
    assert len(started) == 2 and all(proc.poll() is not None for proc, *_ in started)
    assert sorted(p.name for p in (tmp_path / "logs").glob("*.log")) == ["a--seed0.log", "b--seed0.log"]


def test_children_share_the_cores(tmp_path):
    """`--jobs N` gives each child `max(1, cores // N)` intra-op threads on its command line, and
    `--threads` sets this process's."""
    import argparse

    import torch

    from lt2dsl.tasks.jobs import child_command, child_threads

    assert [child_threads(j, cores=16) for j in (1, 5, 15, 16, 32)] == [16, 3, 1, 1, 1]
    args = argparse.Namespace(
        config="x.toml", device="cuda", steps=None, backend=None, data="mqar", force=False, cuda_graph=None
    )
    cmd = child_command(args, tmp_path, threads=3)
    assert cmd[cmd.index("--threads") + 1] == "3" and cmd[cmd.index("--data") + 1] == "mqar"
    assert "--steps" not in cmd and not any("cuda-graph" in c for c in cmd)
    for flag, value in (("--cuda-graph", True), ("--no-cuda-graph", False)):
        assert flag in child_command(argparse.Namespace(**{**vars(args), "cuda_graph": value}), tmp_path, 3)
    (tmp_path / "smoke.toml").write_text(SMOKE)
    before = torch.get_num_threads()
    wanted = 2 if before != 2 else 1
    try:
        argv = [str(tmp_path / "smoke.toml"), "--out", str(tmp_path), "--report-only"]
        assert main([*argv, "--threads", str(wanted)]) == 0
        assert torch.get_num_threads() == wanted
    finally:
        torch.set_num_threads(before)


def test_a_task_threshold_ends_the_training_early(tmp_path, capsys):
    """A data entry's `threshold` on a task without a curriculum: the training stops once the
    window of training batches reaches it (here at once), and the result file says after how many
    steps; without it the training takes all its steps."""
    toml = SMOKE.split("[[data]]")[0].replace('"parity/accuracy", "parity/stage"', '"copy/accuracy"')
    data = '[[data]]\nname = "copy"\ntask = "copy"\nlength = 4\nvocab = 2\n'
    runs = '[[runs]]\nname = "gdn"\nmodel = "m.lt2"\n'
    (tmp_path / "m.lt2").write_text(MODEL)
    for threshold, steps in (("threshold = 0.01\nwindow = 1\n", 1), ("", 3)):
        (tmp_path / "copy.toml").write_text(toml + data + threshold + runs)
        out = tmp_path / f"o{steps}"
        argv = [str(tmp_path / "copy.toml"), "--out", str(out), "--device", "cpu", "--seeds", "0"]
        assert main(argv) == 0, capsys.readouterr().err
        one = json.loads((out / "runs" / "gdn--copy--seed0.json").read_text())
        assert (one["steps"], one["solved"]) == (steps, bool(threshold))


def test_cuda_graph_flag_overrides_the_file_either_way(tmp_path):
    from lt2dsl.tasks.experiment import overridden, parse_args

    path = tmp_path / "smoke.toml"
    path.write_text(SMOKE)
    exp, _ = load_experiment(path)
    assert overridden(exp, parse_args([str(path)])).training.cuda_graph == exp.training.cuda_graph
    on = overridden(exp, parse_args([str(path), "--cuda-graph"]))
    assert on.training.cuda_graph is True
    assert overridden(on, parse_args([str(path), "--no-cuda-graph"])).training.cuda_graph is False


def test_the_cuda_graph_flag_reaches_the_trainer(tmp_path):
    from lt2dsl.tasks.experiment_config import train_config

    path = tmp_path / "smoke.toml"
    path.write_text(SMOKE)
    exp, where = load_experiment(path)
    exp = exp.model_copy(update={"training": exp.training.model_copy(update={"cuda_graph": True})})
    args = (exp, exp.runs[0], exp.data[0], 0, where, "cpu", tmp_path / "run")
    assert train_config(*args).training.cuda_graph is True
    assert train_config(*args, cuda_graph=False).training.cuda_graph is False


def test_greater_checks_need_a_margin_over_the_seeds_spread():
    """A `greater` check agrees or disagrees only past the larger seed std of its two runs: the
    b_recall NIAH rows of GDN and GLA (both at chance, 0.0047 ± 0.001 against 0.0044 ± 0.0003)
    are within noise, DeltaNet against linear attention agrees, a reversed order disagrees; a
    threshold check compares the mean alone; a run without results is not run."""
    from lt2dsl.tasks.experiment_config import CheckConfig
    from lt2dsl.tasks.report import verdict

    def run(mean, std):
        return {"metrics": {"niah/accuracy": {"mean": mean, "std": std, "n": 3}}}

    runs = {"gdn": run(0.0047, 0.001), "gla": run(0.0044, 0.0003), "deltanet": run(0.34, 0.003),
            "linear": run(0.0049, 0.001)}  # fmt: skip

    def check(a, b=None, kind="greater", value=None):
        c = CheckConfig(says="s", metric="niah/accuracy", kind=kind, run=a, than=b, value=value)
        return verdict(c, runs)["verdict"]

    assert check("gdn", "gla") == "within noise" and check("gla", "gdn") == "within noise"
    assert check("deltanet", "linear") == "agrees" and check("linear", "deltanet") == "disagrees"
    assert check("gdn", kind="at_least", value=0.0046) == "agrees"
    assert check("gdn", "full") == "not run"
