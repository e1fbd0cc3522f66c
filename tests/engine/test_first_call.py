"""The work a first `generate` used to do is done once, ahead: `compile` traces and fuses the graph,
every bucket and call reuses it, and `first_call.py` reports that split (CPU, toy sizes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lt2dsl
import lt2dsl.lowering.fx_passes as fx_passes
import lt2dsl.lowering.model as lowering_model

from .test_cli import TOY

ROOT = Path(__file__).parents[2]


@pytest.fixture
def calls(monkeypatch) -> dict[str, int]:
    """How often the graph was traced (`to_fx`) and fused (`fx_passes.fuse`) since the fixture began."""
    counts = {"trace": 0, "fuse": 0}

    def counting(name: str, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(lowering_model, "to_fx", counting("trace", lowering_model.to_fx))
    monkeypatch.setattr(fx_passes, "fuse", counting("fuse", fx_passes.fuse))
    return counts


def test_compile_traces_and_fuses_once_and_no_generate_repeats_it(calls):
    model = lt2dsl.compile(TOY, device="cpu", dtype=torch.float32, build_graph=True).eval()
    assert calls == {"trace": 1, "fuse": 1}
    gm = model.graph_module
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    model.generate(ids[:1], 3)
    model.generate(ids, 3)  # a second bucket
    model.generate([ids[0, :5], ids[1, :2]], 3, temperature=0.7, seed=1)  # ragged, sampled
    assert calls == {"trace": 1, "fuse": 1}
    assert model.graph_module is gm


def test_a_meta_compile_traces_nothing_and_a_moved_model_once_on_its_next_use(calls):
    lt2dsl.compile(TOY, device="meta", build_graph=True)
    assert calls == {"trace": 0, "fuse": 0}
    model = lt2dsl.compile(TOY, device="cpu", dtype=torch.float32, build_graph=True).eval().float()
    # `.float()` (any `.to()`) dropped the graph, which may hold tensors the move replaced
    assert calls == {"trace": 1, "fuse": 1}
    ids = torch.zeros(1, 4, dtype=torch.long)
    model.generate(ids, 2)
    model.generate(torch.zeros(2, 4, dtype=torch.long), 2)
    assert calls == {"trace": 2, "fuse": 2}


def test_a_cpu_compile_leaves_the_graph_to_its_first_use_unless_asked(calls):
    # the default builds at compile on CUDA only: a CPU model (tests, the trainer's blocks) may
    # never run whole, and would pay the trace for nothing
    model = lt2dsl.compile(TOY, device="cpu", dtype=torch.float32).eval()
    assert calls == {"trace": 0, "fuse": 0}
    model(torch.zeros(1, 4, dtype=torch.long))
    assert calls == {"trace": 1, "fuse": 1}


def test_first_call_script_reports_the_graph_under_compile_and_the_slot_once(tmp_path):
    """`first_call.py` on the CPU in a fresh process: the trace, codegen and fusion are phases of the
    compile, none of either generate; the first generate makes the bucket's slot, the second
    reuses it."""
    path = tmp_path / "toy.lt2"
    path.write_text(TOY)
    cmd = [sys.executable, "-m", "tests.engine.first_call", str(path), "--device", "cpu"]
    cmd += ["--dtype", "float32", "--prompt", "6", "--new", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("FIRST_CALL "))
    got = json.loads(line.removeprefix("FIRST_CALL "))
    assert got["device"] == "cpu" and got["compile"] > 0 and got["first"] > 0 and got["second"] > 0
    compiled = got["compile_phases"]
    assert compiled["graph: trace (LeafTracer)"][1] == 1 and compiled["graph: fusion passes"][1] == 1
    assert compiled["graph: codegen (GraphModule.recompile)"][1] >= 1
    for call in ("first_phases", "second_phases"):
        assert not [k for k in got[call] if k.startswith("graph:")], got[call]
        assert got[call]["prefill (eager)"][1] == 1
        assert got[call]["decode step, eager (incl. warm-up and capture)"][1] == 2
    assert got["first_phases"]["engine: bucket slot (cache + step buffers)"][1] == 1
    assert "engine: bucket slot (cache + step buffers)" not in got["second_phases"]
