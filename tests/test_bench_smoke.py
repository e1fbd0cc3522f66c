"""The GPU benchmark scripts run end to end (SMOKE=1: toy sizes on the CPU, no timing claims), so a
GPU session does not discover a broken script after paying for the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_decode_bench_smoke(tmp_path):
    env = dict(
        os.environ,
        SMOKE="1",
        OUT=str(tmp_path),
        MODELS="lt2_hybrid_gdn_dsa,ouro_looped_transformer",
        CONTEXTS="16,32",
        STEPS="2",
        WARM="1",
        PYTHONPATH=str(ROOT),
    )
    cmd = [sys.executable, "bench/decode.py"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads((tmp_path / "decode.json").read_text())["rows"]
    assert [(r["model"], r["L"]) for r in rows] == [
        ("lt2_hybrid_gdn_dsa", 16),
        ("lt2_hybrid_gdn_dsa", 32),
        ("ouro_looped_transformer", 16),
        ("ouro_looped_transformer", 32),
    ]
    # the prefill, the warm-up step and the timed steps all went through the reserved cache
    assert all(r["seen"] == r["L"] + 3 and r["tok_s"] > 0 and r["predicted_tok_s"] > 0 for r in rows)
    assert "| model | B | L | decode ms/step" in out.stdout


def test_blocks_bench_smoke(tmp_path):
    env = dict(os.environ, SMOKE="1", OUT=str(tmp_path / "out"), ONLY="gdn,model", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "bench/blocks.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "out" / "blocks.json").read_text())
    groups = {r["group"] for r in data["rows"]}
    assert any(g.startswith("gdn block") for g in groups)
    assert any(g.startswith("gdn+dsa model") for g in groups)
    assert {r["impl"] for r in data["rows"]} >= {"unfused", "fused"}
    # the subjects start unfused: the rules fire on every one (a fused subject once hid this)
    assert data["fired"] and all(sum(f.values()) > 0 for f in data["fired"].values()), data["fired"]
    assert (tmp_path / "out" / "blocks.md").exists()


def test_decode_host_bench_runs(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), STEPS="1", REPEATS="2", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "bench/decode_host.py"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads((tmp_path / "decode_host.json").read_text())
    assert row["model"] == "lt2_hybrid_gdn_dsa" and len(row["repeats_ms"]) == 2 and row["min_ms"] > 0
    assert row["launching_aten_ops"] > 0


def test_determinism_probe_helpers():
    """The probe's pieces on the CPU: families resolve to cases, a re-run's difference is 0 for
    identical results, relative to the largest magnitude otherwise, and inf with a NaN."""
    import torch

    from bench import determinism_probe as dp

    for module, groups, impls, _forced, _n in dp._families():
        found = [c for c in module.cases() if c.backward and c.impl in impls and c.group.startswith(groups)]
        assert found, module.__name__
    x = torch.randn(5, 3, requires_grad=True)
    first, again = dp._run(lambda: (x * 2).sin(), [x]), dp._run(lambda: (x * 2).sin(), [x])
    assert len(first) == 2 and all(dp._rel_diff(a, b) == 0.0 for a, b in zip(again, first))
    assert dp._rel_diff(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0])) == 0.25
    assert dp._rel_diff(torch.tensor([float("nan")]), torch.tensor([1.0])) == float("inf")


@pytest.mark.parametrize("bwd", ["0", "1"])
def test_ncu_pair_driver_smoke(bwd):
    env = dict(os.environ, SMOKE="1", OP="gdn", BWD=bwd, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "bench/ncu_pair.py"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"profiled: lt2dsl (gdn {'fwd+bwd' if bwd == '1' else 'fwd'}" in out.stdout


def test_delta_bench_switches_hold_through_the_backward():
    """A kernels_delta case sets every `delta_launch` switch when it runs and leaves them set: the
    harness runs the backward after the call returns, and the reverse scan reads its switches then.
    The next case puts the ones it does not name back at their defaults."""
    import pytest

    import lt2dsl.kernels.delta.launch as launch
    from bench import kernels_delta as kd

    seen = []

    def make():
        return (lambda: seen.append((launch.TSTATE_BWD, launch.WBWD))), []

    try:
        variant, _ = kd._flags(make, TSTATE_BWD=True, WBWD=False)()
        variant()
        assert (launch.TSTATE_BWD, launch.WBWD) == (True, False)  # still set for the backward
        default, _ = kd._flags(make)()
        default()
        assert seen == [(True, False), (kd._DEFAULTS["TSTATE_BWD"], kd._DEFAULTS["WBWD"])]
        with pytest.raises(ValueError, match="unknown delta_launch switches"):
            kd._flags(make, NO_SUCH_SWITCH=1)
    finally:
        kd._restore_switches()
    assert kd._DEFAULTS["TSTATE_BWD"] == launch.TSTATE_BWD


def test_delta_bench_runs_default_and_peer_before_variants(monkeypatch):
    """Within each (shape, mode) the default row, then the peer's, come before every variant row
    (the cases list them default, variants, peer), so a stage cut by its time limit keeps the
    same-run pair."""
    from bench import kernels_delta as kd

    # a stand-in peer, so the order is checked where fla is not installed (as in CI)
    monkeypatch.setattr(kd, "_peer_chunk", lambda op: lambda x: None)
    monkeypatch.setenv("SCRATCH", "1")
    monkeypatch.setenv("GRADBK", "1")
    monkeypatch.setenv("ONLY", "deltanet B=4 T=8192")
    monkeypatch.delenv("IMPLS", raising=False)
    rows = [(c.group, c.backward, c.impl) for c in kd.cases()]
    assert any(impl == "lt2dsl-lp1du0" for *_, impl in rows)
    for key in dict.fromkeys((g, b) for g, b, _ in rows):
        impls = [impl for g, b, impl in rows if (g, b) == key]
        assert impls[:2] == ["lt2dsl", "fla"], impls
