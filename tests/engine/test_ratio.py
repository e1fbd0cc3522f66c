"""The decode speed ratio of two models against context (`lt2dsl.engine.bench.ratio_curve`,
`passes`, `report.measured_ratios`, `report.ratio_plot`) and `bench/decode_compare.py --replot`,
on the CPU: the estimate's ratio is the two estimates' quotient, a point where a model does not
fit has none, and the first passing context is where the ratio reaches the target or the slow
model alone runs out of memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lt2dsl
from lt2dsl.cost.hardware import load_hardware
from lt2dsl.engine import bench
from lt2dsl.engine.report import measured_ratios, ratio_plot

ROOT = Path(__file__).parents[2]
LOOPED = ("lt2_hybrid_gdn_dsa", "ouro_looped_transformer")


@pytest.fixture(scope="module")
def models():
    return [
        lt2dsl.compile(ROOT / "examples" / f"{s}.lt2", device="meta", dtype=torch.bfloat16) for s in LOOPED
    ]


def test_the_curve_is_the_estimates_quotient_where_both_fit(models):
    hw = load_hardware("h100")
    curve = bench.ratio_curve(*models, (1, 32), (4096, 131072), hw)
    assert [(r["batch"], r["ctx"]) for r in curve] == [(1, 4096), (1, 131072), (32, 4096), (32, 131072)]
    for r in curve:
        f, s = (bench.predicted(m, r["batch"], r["ctx"], hw) for m in models)
        assert r["fast_fits"] == (r["batch"] <= f["estimate_max_batch"])
        assert r["slow_fits"] == (r["batch"] <= s["estimate_max_batch"])
        if r["fast_fits"] and r["slow_fits"]:
            assert r["estimate"] == pytest.approx(f["estimate_tok_s"] / s["estimate_tok_s"])
        else:
            assert r["estimate"] is None
    # the looped attention baseline's KV cache outgrows the card first
    assert curve[0]["estimate"] is not None and not curve[2]["slow_fits"] and curve[2]["fast_fits"]


def test_the_first_passing_context_per_batch():
    def pt(batch, ctx, est, fast=True, slow=True):
        return {"batch": batch, "ctx": ctx, "estimate": est, "fast_fits": fast, "slow_fits": slow}

    curve = [
        pt(1, 2, 1.0), pt(1, 4, 5.8), pt(1, 8, None, slow=False),  # reaches the target at 4
        pt(2, 2, 2.0), pt(2, 4, None, slow=False),  # the baseline runs out first
        pt(3, 2, 1.0), pt(3, 4, None, fast=False, slow=False),  # neither: both out of memory
    ]  # fmt: skip
    first = bench.passes(curve, 5.7)
    assert first == {1: {"ctx": 4, "why": "estimate 5.80x"}, 2: {"ctx": 4, "why": "baseline out of memory"}}


def test_measured_ratios_keep_the_baselines_out_of_memory_points(tmp_path):
    def row(model, batch, ctx, tok_s=None):
        return {"model": model, "batch": batch, "ctx": ctx, "tok_s": tok_s, "oom": tok_s is None}

    rows = [
        row("f", 1, 4, 30.0),
        row("s", 1, 4, 10.0),
        row("f", 8, 4, 80.0),
        row("s", 8, 4),
        row("f", 8, 8),
        row("s", 8, 8),
    ]
    got = measured_ratios(rows, "f", "s")
    assert got == [
        {"batch": 1, "ctx": 4, "measured": 3.0, "slow_oom": False},
        {"batch": 8, "ctx": 4, "measured": None, "slow_oom": True},
    ]
    curve = [{"batch": b, "ctx": c, "estimate": e, "fast_fits": True, "slow_fits": e is not None}
             for b, c, e in ((1, 4, 3.5), (1, 8, 6.0), (8, 4, None))]  # fmt: skip
    info = {"device": "cpu", "dtype": "bf16", "hw": "h100"}
    ratio_plot(tmp_path / "r.png", curve, got, info, ("f", "s"))
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_decode_compare_replots_a_saved_run(tmp_path):
    """`--replot` rebuilds looped.png, ratio.png and ratio.json from a looped.json without a GPU."""
    saved = {
        "device": "NVIDIA H100 80GB HBM3",
        "torch": "x",
        "hw": "h100",
        "dtype": "bf16",
        "steps": 32,
        "warm": 4,
    }
    points = []
    for model, tok_s in zip(LOOPED, (120.0, 100.0)):
        points.append({"model": model, "batch": 1, "ctx": 8192, "tok_s": tok_s, "estimate_tok_s": 2 * tok_s,
                       "estimate_max_batch": 12, "oom": None})  # fmt: skip
    (tmp_path / "looped.json").write_text(json.dumps(saved | {"points": points}))
    out = tmp_path / "plots"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "decode_compare.py"),
        "--replot",
        str(tmp_path / "looped.json"),
    ]
    subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True, text=True, cwd=ROOT)
    result = json.loads((out / "ratio.json").read_text())
    assert result["measured"] == [{"batch": 1, "ctx": 8192, "measured": 1.2, "slow_oom": False}]
    assert {r["ctx"] for r in result["curve"]} == {2**k for k in range(11, 18)}
    for name in ("ratio.png", "looped.png", "ratio.json"):
        assert (out / name).stat().st_size > 0 and (out / name).stat().st_mode & 0o777 == 0o644
