"""Two CPU processes on gloo train the same run as one process with the same global batch.

One `torchrun --nproc-per-node 2` launch trains three configs of the tiny looped GDN + DSA model:
FSDP2 with tied embeddings; FSDP2 untied with per-application activation checkpointing, gradient
accumulation and DCP checkpoints; DDP; FSDP2 over blocks compiled whole (`training.compile`) on
task rows. Each must give the single process's losses within 1e-5
(fp32). Checkpoints cross world sizes both ways: the 2-process DCP checkpoint continues in one
process, and a 1-process safetensors checkpoint continues in two, the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lt2dsl.train import checkpoint as ckpt
from lt2dsl.train import run

from .helpers import config

WORKER = Path(__file__).with_name("dist_worker.py")
ROOT = Path(__file__).parents[2]


def untied_ac(tmp: Path, out: str, **checkpoint) -> dict:
    training = {"grad_accum": 2, "activation_checkpoint": "per_application"}
    return config(tmp, out, tied=False, training=training, checkpoint=checkpoint)


def compiled_task(tmp: Path, out: str) -> dict:
    """Unpacked task rows through fullgraph-compiled blocks (the `eager` backend), checkpointed."""
    training = {"activation_checkpoint": "per_application", "compile": True, "compile_backend": "eager"}
    cfg = config(tmp, out, tied=False, training=training, metrics={"eval_rows": 4})
    cfg["data"] = {"task": "mqar", "vocab": 64, "length": 16, "num_kv_pairs": 2}
    return cfg


def configs(tmp: Path) -> dict[str, dict]:
    """The runs of the 2-process launch; `from_one` resumes a 1-process checkpoint written first."""
    single = run(untied_ac(tmp, "single", enable=True, interval=3, keep_latest_k=0))
    from_one = untied_ac(tmp, "from_one")
    from_one["resume"] = str(single.checkpoint.parent / "step-000003")
    return {
        "fsdp_tied": config(tmp, "fsdp_tied", tied=True),
        "fsdp_untied_ac": untied_ac(tmp, "fsdp_untied_ac", enable=True, interval=3, keep_latest_k=0),
        "ddp": config(tmp, "ddp", tied=False, parallel={"strategy": "ddp"}),
        "fsdp_compiled": compiled_task(tmp, "fsdp_compiled"),
        "from_one": from_one,
    }


def launch(tmp: Path, cfgs: dict[str, dict]) -> dict:
    paths = []
    for name, cfg in cfgs.items():
        (tmp / f"{name}.json").write_text(json.dumps(cfg))
        paths.append(str(tmp / f"{name}.json"))
    out = tmp / "results.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [*cmd, str(WORKER), str(out), *paths], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    return {name: results[p] for name, p in zip(cfgs, paths)}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    cfgs = configs(tmp)
    return tmp, cfgs, launch(tmp, cfgs)


def one_process(cfg: dict, out: str, **kw):
    cfg = json.loads(json.dumps(cfg))
    cfg["training"]["out"] = out
    cfg["checkpoint"]["enable"] = False
    return run(cfg, **kw)


@pytest.mark.parametrize("name", ["fsdp_tied", "fsdp_untied_ac", "ddp", "fsdp_compiled"])
def test_two_processes_match_one(two_processes, name):
    tmp, cfgs, results = two_processes
    one = one_process(cfgs[name], str(tmp / f"{name}_one"))
    two = {int(s): v for s, v in results[name]["losses"].items()}
    assert sorted(two) == sorted(one.losses) == list(range(1, 7))
    for s in two:
        assert abs(two[s] - one.losses[s]) < 1e-5, (s, two[s], one.losses[s])
    ((step, loss),) = results[name]["evals"].items()
    assert abs(loss - one.evals[int(step)]) < 1e-5


def test_a_two_process_checkpoint_continues_in_one_process(two_processes):
    tmp, cfgs, results = two_processes
    root = tmp / "fsdp_untied_ac" / "checkpoints"
    assert [p.name for p in ckpt.complete(root)] == ["step-000003", "step-000006"]
    assert (root / "step-000003" / ckpt.DCP_INDEX).is_file()
    assert (root / "step-000006" / "model.safetensors").is_file()  # the final step, whole
    resumed = one_process(cfgs["fsdp_untied_ac"], str(tmp / "resumed"), resume=root / "step-000003")
    assert sorted(resumed.losses) == [4, 5, 6]
    two = {int(s): v for s, v in results["fsdp_untied_ac"]["losses"].items()}
    for s in (4, 5, 6):
        assert abs(resumed.losses[s] - two[s]) < 1e-5, (s, resumed.losses[s], two[s])


def test_a_one_process_checkpoint_continues_in_two(two_processes):
    tmp, cfgs, results = two_processes
    whole = {int(s): v for s, v in results["fsdp_untied_ac"]["losses"].items()}
    resumed = {int(s): v for s, v in results["from_one"]["losses"].items()}
    assert sorted(resumed) == [4, 5, 6]
    for s in (4, 5, 6):
        assert abs(resumed[s] - whole[s]) < 1e-5, (s, resumed[s], whole[s])
