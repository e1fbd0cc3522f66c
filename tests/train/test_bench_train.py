"""`bench/train_throughput.py --smoke` runs end to end on the CPU (toy sizes, no timing claims), so a
GPU session does not find the script broken after paying for the machine."""

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
    cmd += ["--models", "llama", "--contexts", "32", "--tokens", "64", "--steps", "2", "--bare-steps", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "train_throughput.json").read_text())
    impls = {r["impl"]: r for r in data["rows"]}
    assert {"trainer", "bare"} <= set(impls)
    assert impls["trainer"]["tok_s"] > 0 and impls["trainer"]["estimate_gib"] > 0
    assert "overhead_pct" in impls["trainer"] and impls["bare"]["mfu"] > 0
    if importlib.util.find_spec("transformers") is not None:  # HF Llama of the same shape, same loop
        assert impls["hf"]["tok_s"] > 0
    assert "| model | T | B | impl | tok/s | MFU %" in out.stdout
