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


def test_delta_bench_runs_default_and_peer_before_variants(monkeypatch):
    """A row per named recipe (`RECIPES=split,fused`) where the rule has its forms; within each
    (shape, mode) the default row, then the peer's, come before them, so a stage cut by its time
    limit keeps the same-run pair."""
    from bench import kernels_delta as kd

    # a stand-in peer, so the order is checked where fla is not installed (as in CI)
    monkeypatch.setattr(kd, "_peer_chunk", lambda op: lambda x: None)
    monkeypatch.setenv("RECIPES", "split,fused")
    monkeypatch.setenv("ONLY", "B=4 T=8192")
    monkeypatch.delenv("IMPLS", raising=False)
    rows = [(c.group, c.backward, c.impl) for c in kd.cases()]
    by_op = {g.split()[0]: {i for gg, _, i in rows if gg == g} for g, _, _ in rows}
    assert by_op["deltanet"] == {"lt2dsl", "lt2dsl-split", "lt2dsl-fused", "fla"}
    assert by_op["kda"] == {"lt2dsl", "lt2dsl-split", "fla"}  # KDA has no fused scan
    for key in dict.fromkeys((g, b) for g, b, _ in rows):
        impls = [impl for g, b, impl in rows if (g, b) == key]
        assert impls[:2] == ["lt2dsl", "fla"], impls


def test_dsa_train_step_bench_smoke(tmp_path):
    """Every row of `bench/dsa_train_step.py` runs at toy sizes; the one-pass KL dispatches fewer
    ops than the per-document one it replaced."""
    cmd = [sys.executable, "bench/dsa_train_step.py", "--smoke", "--steps", "1", "--out", str(tmp_path)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads((tmp_path / "dsa_train_step.json").read_text())["rows"]
    assert set(rows) == {"full", "gdn", "dsa", "dsa+kl", "dsa+kl-eager", "dsa+kl-legacy", "dsa+kl-all"}
    assert all(r["ms"] > 0 and r["aten_ops"] > 0 for r in rows.values())
    assert rows["dsa"]["aten_ops"] < rows["dsa+kl"]["aten_ops"] < rows["dsa+kl-legacy"]["aten_ops"]


def test_decode_gemv_bench_reads_the_hybrids_shapes():
    """`bench/decode_gemv.py` (GPU only) times the projections of the model's first GDN and DSA
    blocks: the in-projections as the fusion pass concatenates them (padded to 16 rows)."""
    from bench.decode_gemv import gdn_group, shapes

    path = str(Path(__file__).parents[1] / "examples" / "lt2_hybrid_gdn_dsa.lt2")
    sh = shapes(path)
    assert gdn_group(path) == 256  # the gated norm's group: GDN's head value width (128 · expand_v 2)
    # GDN: q, k 2048; v, g 4096 (expand_v 2); a, b 16 -> 12304, padded; DSA: q, k, v 2048, index 256 + 64 + 4
    assert sh["GatedDeltaNet in"] == (12320, 2048) and sh["SparseAttention in"] == (6480, 2048)
    assert sh["GatedDeltaNet o_proj"] == (2048, 4096) and sh["SparseAttention o_proj"] == (2048, 2048)
    assert sh["GatedDeltaNet gate/up"] == (11264, 2048) and sh["GatedDeltaNet down"] == (2048, 5632)


def test_decode_stream_chain_on_the_interpreter():
    """`bench/decode_stream.py`'s kernel under the CPU interpreter at irregular shapes: the four
    products launched one by one and in one program through its grid barriers (one program: the
    interpreter runs programs in turn, so more would wait forever) give the same bits, within bf16
    rounding of the float64 chain; each launch adds 3 to the barrier's counter; the GDN block's
    shapes chain (o_proj reads the value part of the in-projection's output)."""
    import torch

    from bench.decode_stream import Chain, block_shapes, rel_err

    torch.manual_seed(0)
    nk = [(100, 40), (48, 37), (70, 48), (33, 35)]
    ws = [torch.randn(n, k, dtype=torch.bfloat16) / k**0.5 for n, k in nk]
    for M in (1, 3):
        ch = Chain(ws, M, "cpu")
        ref = ch.reference()
        split = ch.split(ws).clone()
        one = ch.launch(ws, 0, programs=1).clone()
        assert torch.equal(split, one)
        assert rel_err(one, ref) < 2e-2 and rel_err(ch.cublas(ws), ref) < 2e-2
        assert ch.launch(ws, 0, programs=1).equal(one) and ch.bars[1].item() == 6
    sh = block_shapes(str(Path(__file__).parents[1] / "examples" / "lt2_hybrid_gdn_dsa.lt2"))
    assert sh == [(12320, 2048), (2048, 4096), (11264, 2048), (2048, 5632)]
    Chain([torch.empty(n, k, dtype=torch.bfloat16) for n, k in sh], 1, "cpu")  # the shapes chain


def test_decode_stream_block_cases_agree_on_the_interpreter():
    """`bench/decode_stream.py`'s whole-block cases at a small shape on the CPU: today's kernels
    and the block kernel's six launches agree within bf16 rounding, its one launch (one program)
    gives the six launches' bits."""
    import torch

    from bench.decode_stream import ONE, SPLIT, TODAY, block_cases, rel_err
    from lt2dsl.kernels.block.testing import as_dtype

    cases, base, nbytes = block_cases(2, (48, 2, 4, 24, 40, 40), "cpu", persistent_programs=1)
    assert nbytes == 2 * sum(base[w].numel() for w in ("w_in", "w_o", "w_gu", "w_down"))
    outs = {n: fn(as_dtype(base, torch.bfloat16)) for n, fn in cases.items()}
    for got, want in zip(outs[SPLIT], outs[TODAY]):
        assert rel_err(got, want.double()) < 2e-2
    assert all(torch.equal(a, b) for a, b in zip(outs[ONE], outs[SPLIT]))


TINY = """model tiny {
  dim = 64
  vocab = 256
  heads = 2
  head_dim = 32
  mlp = swiglu(hidden=128)
  max_len = 256
  loop T=2 < gdn; dsa(topk=4, index_heads=2, index_dim=16) >
}
"""


def test_decode_profile_bench_smoke(tmp_path):
    """`bench/decode_profile.py` on the CPU (no graphs: the aten ops stand in for kernels): a decode
    row and a prefill row per point, kernels by kind (the profiler's own cost inflates CPU op times,
    so busy and step are not compared here)."""
    src = tmp_path / "tiny.lt2"
    src.write_text(TINY)
    args = ["--device", "cpu", "--ctx", "8,16", "--steps", "2", "--profiled", "2", "--warm", "1", "--prefill"]
    cmd = [sys.executable, "bench/decode_profile.py", str(src), *args, "--out", str(tmp_path / "p")]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads((tmp_path / "p" / "decode_profile.json").read_text())
    assert info["package"] == str(ROOT / "lt2dsl")
    rows = info["rows"]
    assert [(r["model"], r["ctx"]) for r in rows] == [("tiny", 8), ("tiny", 16)]
    for r in rows:
        assert r["kernels"] > 0 and "gemm" in r["kinds"] and r["busy_us"] > 0 and r["step_us"] > 0
        assert r["prefill"]["kernels"] > r["kernels"] and r["top"]
        assert sum(k["count"] for k in r["by_name"]) == pytest.approx(r["kernels"])


def test_ceilings_preset_is_a_valid_hardware_file(tmp_path):
    """`bench/ceilings.py`'s preset of measured ceilings loads as the estimate's hardware (GPU-only
    script: its measurement is not run here, its preset's format is)."""
    from bench.ceilings import preset
    from lt2dsl.cost.hardware import load_hardware

    m = {"device": "X", "bf16_TFLOPs": 700.0, "read_GBps": 2900.0, "memory_bytes": 80e9, "copy_GBps": 2600.0}
    m["kernel_us"] = 1.25
    path = tmp_path / "x-measured.json"
    path.write_text(json.dumps(preset("x-measured", m)))
    hw = load_hardware(str(path))
    assert hw.hbm_bytes_per_s == 2.9e12 and hw.peak_flops["bf16"] == 7e14 and hw.name == "x-measured"
    assert hw.kernel_s == pytest.approx(1.25e-6, rel=1e-12)


def test_decode_ab_runs_both_trees(tmp_path):
    """`bench/decode_ab.py` on the CPU at toy sizes, the base a copy of this tree's package: both
    trees' points in the table's JSON, each tree's profile of its own package and their
    kernel-by-kernel difference (`--profile`), and a base folder without a package refused before
    anything runs (rounds: `test_decode_ab_summary_takes_each_trees_median`)."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(ROOT / "lt2dsl", base / "lt2dsl", ignore=shutil.ignore_patterns("__pycache__"))
    (base / "COMMIT").write_text("abc1234\n")
    toy = ["--set", "dim=64", "--set", "heads=4", "--set", "vocab=256", "--set", "mlp=swiglu(hidden=128)"]
    out_dir = str(tmp_path / "ab")
    shape = ["--ctx", "16", "--batch", "1", "--steps", "1", "--warm", "0", "--rounds", "1"]
    cmd = [sys.executable, "bench/decode_ab.py", "examples/lt2_sparse_swa.lt2", "--base", str(base), *shape,
           "--out", out_dir, *toy, "--profile", "--profiled", "1"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    info = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert info["base_commit"] == "abc1234"
    assert set(info["return_codes"]) == {"new_0", "base_0", "profile_new", "profile_base"}
    (row,) = info["rows"]
    assert (row["model"], row["batch"], row["ctx"]) == ("lt2_sparse_swa", 1, 16)
    assert row["new_runs"] == row["base_runs"] == 1 and row["new_over_base"] > 0
    for tag, root in (("new", ROOT), ("base", base)):
        prof = json.loads((tmp_path / "ab" / f"profile_{tag}" / "decode_profile.json").read_text())
        assert prof["package"] == str((root / "lt2dsl").resolve())
    (diff,) = info["profile"]
    assert (diff["model"], diff["batch"], diff["ctx"]) == ("lt2_sparse_swa", 1, 16)
    assert diff["new_step_us"] > 0 and diff["base_step_us"] > 0 and 0 < len(diff["kernels"]) <= 12
    bad = subprocess.run(
        [*cmd[:4], str(tmp_path), *cmd[5:]], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "holds no lt2dsl/ package" in bad.stdout


def test_decode_ab_summary_takes_each_trees_median():
    """`decode_ab.summarize` over rounds: each tree's median tok/s, its runs, new / base and each
    against this tree's estimate; a point out of memory in every round is `oom`. `kernel_diff`:
    the kernels whose µs changed most first, a kernel one tree lacks at 0 there."""
    from bench.decode_ab import kernel_diff, summarize

    def pt(tok, oom=False, est=100.0):
        return {"model": "m", "batch": 1, "ctx": 16, "tok_s": tok, "oom": oom, "estimate_tok_s": est}

    runs = {"new": [[pt(10.0)], [pt(30.0)], [pt(20.0)]], "base": [[pt(None, True)], [pt(None, True)]]}
    (row,) = summarize(runs)
    assert row["new_tok_s"] == 20.0 and row["new_runs"] == 3 and row["new_of_estimate"] == 0.2
    assert row["base_oom"] and row["base_tok_s"] is None and row["new_over_base"] is None
    runs["base"] = [[pt(8.0)], [pt(12.0)]]
    (row,) = summarize(runs)
    assert row["base_tok_s"] == 10.0 and row["base_runs"] == 2 and row["new_over_base"] == 2.0

    def prof(us: dict) -> dict:
        by_name = [{"name": k, "us": v} for k, v in us.items()]
        return {"rows": [{"model": "m", "batch": 1, "ctx": 16, "step_us": sum(us.values()), "kernels": 3,
                          "by_name": by_name}]}  # fmt: skip

    (d,) = kernel_diff(prof({"a": 5.0, "b": 9.0}), prof({"a": 6.0, "c": 2.0, "b": 1.0}), top=2)
    assert [k["name"] for k in d["kernels"]] == ["b", "c"]
    assert d["kernels"][1] == {"name": "c", "new_us": 0.0, "base_us": 2.0}
    assert kernel_diff(None, prof({"a": 1.0})) == []


def test_decode_ab_refuses_a_profile_of_another_package(tmp_path, monkeypatch):
    """`profile_tree` takes a profile only of the package of the tree it was run for."""
    import argparse

    import bench.decode_ab as ab

    def fake_run(root, cmd, args, log_path, package):
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "decode_profile.json").write_text(json.dumps({"package": str(package), "rows": []}))
        Path(log_path).write_text("")
        return 0

    args = argparse.Namespace(ctx="16", batch="1", steps=1, warm=0, profiled=1, set=[], timeout=None)
    tree = tmp_path / "tree"
    (tree / "lt2dsl").mkdir(parents=True)
    for package, want in ((tree / "lt2dsl", 0), (ROOT / "lt2dsl", 1)):
        monkeypatch.setattr(ab, "run_in", lambda *a, package=package: fake_run(*a, package))
        out = tmp_path / f"p{want}"
        code, info = ab.profile_tree(tree, [Path("m.lt2")], args, out, tmp_path / f"log{want}")
        assert code == want and (info is None) == bool(want)
    assert "expected" in (tmp_path / "log1").read_text()
