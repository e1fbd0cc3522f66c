"""`bench/train_throughput.py`, `bench/train_factors.py` and `bench/train_profile.py` run end to end
on the CPU (toy sizes, no timing claims), so a GPU session does not find the scripts broken after
paying for the machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_train_throughput_smoke(tmp_path):
    cmd = [sys.executable, "bench/train_throughput.py", "--smoke", "--out", str(tmp_path)]
    cmd += ["--models", "llama12", "--contexts", "32", "--tokens", "64"]
    cmd += ["--window-s", "0", "--max-steps", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "train_throughput.json").read_text())
    impls = {r["impl"]: r for r in data["rows"]}
    assert {"trainer", "bare"} <= set(impls)
    assert impls["trainer"]["tok_s"] > 0 and impls["trainer"]["estimate_gib"] > 0
    assert impls["trainer"]["steps"] == impls["bare"]["steps"] == 2
    assert "overhead_pct" in impls["trainer"] and impls["bare"]["mfu"] > 0
    trainer = impls["trainer"]  # three paired rounds, the medians reported; the save's wait ≤ its write
    assert len(trainer["rounds"]) == len(impls["bare"]["rounds"]) == len(trainer["overhead_rounds"]) == 3
    assert trainer["step_s"] == sorted(trainer["rounds"])[1]
    assert 0 < trainer["ckpt_wait_s"] <= trainer["ckpt_write_s"]
    assert trainer["added_pct"] == trainer["overhead_pct"] + trainer["ckpt_pct"]
    if importlib.util.find_spec("transformers") is not None:  # HF Llama of the same shape, same loop
        assert impls["hf"]["tok_s"] > 0
    assert "| model | T | B | impl | tok/s | MFU %" in out.stdout


def test_train_factors_smoke(tmp_path):
    cmd = [sys.executable, "bench/train_factors.py", "--smoke", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "train_factors.json").read_text())
    rows = {r["way"]: r for r in data["rows"]}
    assert set(rows) == {"lowered bf16", "trainer", "trainer fused, autocast", "trainer eager, autocast"}
    assert all(r["tok_s"] > 0 and r["saved_per_token_app"] > 0 for r in rows.values()), rows
    assert "| way | tok/s | peak GiB | saved B/token/app" in out.stdout


def test_train_profile_smoke(tmp_path):
    cmd = [sys.executable, "bench/train_profile.py", "--smoke", "--out", str(tmp_path)]
    cmd += ["--models", "llama12", "--contexts", "32", "--tokens", "64", "--warm", "1", "--profiled", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = json.loads((tmp_path / "train_profile.json").read_text())["rows"]
    assert row["model"] == "llama12" and row["T"] == 32 and row["step_us"] > 0 and row["tok_s"] > 0
    assert row["kernels"] > 0 and row["top"] and 0 < row["top"][0]["share"] <= 1
    assert "top kernels" in out.stdout


def test_throughput_window_waits_for_the_device_only_at_its_bounds(monkeypatch):
    """A synchronisation inside a timed window would stop the host running ahead of the device and
    charge the trainer for it: `Window` syncs at the warm-up's two marks and at each window's ends."""
    sys.path.insert(0, str(ROOT))
    from bench import train_throughput as tt

    syncs, bare_runs = [], []
    monkeypatch.setattr(tt, "sync", lambda: syncs.append(step))
    window = tt.Window(window_s=0.0, max_steps=30, rounds=3, bare=bare_runs.append)
    step, done = 0, False
    while not done:
        step += 1
        done = window(step, None)
    n = window.n  # 2: the smallest window
    assert step == tt.WARM + 3 * n and bare_runs == [n] * 3 and len(window.trainer_s) == 3
    ends = [tt.WARM + k * n for k in (1, 2, 3)]
    # each end: its mark, then `_begin`'s sync before the next window (not after the last)
    assert syncs == [tt.WARM - 1, tt.WARM, tt.WARM, ends[0], ends[0], ends[1], ends[1], ends[2]]
