"""`lt2dsl bench decode` and `lt2dsl warmup` at toy size on the CPU (so the commands cannot rot),
the out-of-memory bookkeeping, and the on-disk autotune cache switch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import lt2dsl
from lt2dsl.cli import main
from lt2dsl.cost.hardware import load_hardware
from lt2dsl.engine import bench
from lt2dsl.engine.report import oom_note, plot, summary_table, table

TOY = """model toy {
  dim = 32
  vocab = 64
  heads = 2
  head_dim = 16
  loop T=2 < gdn(expand_v=1); swa(window=4) >
}
"""


# bytes of TOY's parameters in fp32
WEIGHTS = 4 * sum(p.numel() for p in lt2dsl.compile(TOY, device="meta").parameters())


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy.lt2"
    path.write_text(TOY)
    return path


def test_bench_decode_writes_table_json_and_plot(toy, tmp_path, capsys):
    out_json, out_png = tmp_path / "r" / "decode.json", tmp_path / "decode.png"
    argv = ["bench", "decode", str(toy), "--ctx", "8,16", "--batch", "1,2", "--steps", "2", "--warm", "0"]
    assert main([*argv, "--json", str(out_json), "--plot", str(out_png), "--device", "cpu"]) == 0
    data = json.loads(out_json.read_text())
    assert data["device"].startswith("cpu") and data["hw"] == "cpu" and data["dtype"] == "fp32"
    assert [(p["batch"], p["ctx"]) for p in data["points"]] == [(1, 8), (1, 16), (2, 8), (2, 16)]
    for p in data["points"]:
        # first_s and prefill_s are separate timings: at toy sizes on a CPU their order is noise
        assert p["tok_s"] > 0 and p["estimate_tok_s"] > 0 and p["first_s"] > 0 and p["prefill_s"] > 0
        assert p["tok_s"] == pytest.approx(p["batch"] / p["step_ms"] * 1e3)
        # the estimate's bytes of a step (weights once per application, the cache a step reads)
        assert p["estimate_step_bytes"] >= WEIGHTS
        assert p["bandwidth_gb_s"] == pytest.approx(p["estimate_step_bytes"] / p["step_ms"] / 1e6)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert data["summary"] == bench.summary(data["points"])
    assert [(s["batch"], s["contexts"]) for s in data["summary"]] == [(1, [8, 16]), (2, [8, 16])]
    text = capsys.readouterr().out
    assert "tok/s" in text and "estimate tok/s" in text and "toy" in text and "longest / shortest" in text


def test_bench_decode_runs_each_model_once_per_rule_set(toy, tmp_path):
    out_json = tmp_path / "decode.json"
    argv = ["bench", "decode", str(toy), "--ctx", "8", "--batch", "1", "--steps", "1", "--warm", "0"]
    assert main([*argv, "--rules", "default,+decode_gemv", "--json", str(out_json), "--device", "cpu"]) == 0
    points = json.loads(out_json.read_text())["points"]
    assert [p["model"] for p in points] == ["toy", "toy+decode_gemv"]


def test_warmup_runs_each_shape(toy, capsys):
    assert main(["warmup", str(toy), "--ctx", "8", "--batch", "1,2", "--device", "cpu"]) == 0
    out = capsys.readouterr()
    assert "first generate s" in out.out
    assert "on cpu no kernel is compiled or tuned" in out.err


@pytest.mark.parametrize(
    "argv, code",
    [
        (["bench", "decode", "{toy}", "--ctx", "4q"], 2),
        (["bench", "decode", "{toy}", "--steps", "0"], 2),
        (["bench", "decode", "{toy}", "--hw", "tpu9"], 2),
        (["bench", "decode", "missing.lt2"], 2),
        (["bench", "decode", "{toy}", "--set", "dim=-1"], 1),
        (["bench", "decode", "{toy}", "--rules", "+decode_gemvv"], 2),
        (["bench", "decode", "{toy}", "--rules", "decode_gemv"], 2),
        (["bench", "decode", "{toy}", "--rules", "+decode_gemv", "--no-fuse"], 2),
        (["warmup", "{toy}", "--device", "cuda"], 0 if torch.cuda.is_available() else 2),
    ],
)
def test_bad_use_is_a_clean_error(toy, argv, code, capsys):
    argv = [a.format(toy=toy) for a in argv]
    if code == 0:
        pytest.skip("a CUDA device is present")
    assert main(argv) == code
    assert "Traceback" not in capsys.readouterr().err


def test_a_bad_batch_is_named_as_a_batch_size(toy, capsys):
    assert main(["bench", "decode", str(toy), "--batch", "0"]) == 2
    assert "--batch: expected a positive batch size such as 1, 8 or 32, got '0'" in capsys.readouterr().err


def test_help_lists_the_engine_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "bench" in out and "warmup" in out


def test_an_out_of_memory_point_is_recorded_and_compared(monkeypatch, tmp_path):
    """A point that runs out of memory is kept as `oom` with the estimate's largest batch, the
    larger contexts of that batch are skipped, and the table and plot show them."""
    model = lt2dsl.compile(TOY, device="cpu", dtype=torch.float32)
    real = bench.measure

    def measure(engine, batch, ctx, plan, step_bytes):
        if batch == 2 and ctx >= 16:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(engine, batch, ctx, plan, step_bytes)

    monkeypatch.setattr(bench, "measure", measure)
    plan = bench.Plan((8, 16, 32), (1, 2), 1, 0, load_hardware("h100"))
    rows = bench.run([("toy", model)], plan)
    oom = [(r["batch"], r["ctx"], bool(r.get("skipped"))) for r in rows if r.get("oom")]
    assert oom == [(2, 16, False), (2, 32, True)]
    note = oom_note(next(r for r in rows if r.get("oom")))
    assert "estimate's largest batch" in note and "expected it to fit" in note  # a toy fits on an H100
    assert oom_note({"batch": 9, "estimate_max_batch": 8}).endswith("(as the estimate predicts)")
    info = bench.meta(torch.device("cpu"), plan, torch.float32)
    assert table(rows, info).row_count == 6
    plot(tmp_path / "p.png", rows, info)
    assert (tmp_path / "p.png").stat().st_size > 0


def point(model, batch, ctx, tok_s=None, est=100.0, cap=4, **kw):
    row = {"model": model, "batch": batch, "ctx": ctx, "estimate_tok_s": est, "estimate_max_batch": cap}
    return row | ({"tok_s": tok_s} if tok_s is not None else {"oom": True}) | kw


def test_summary_condenses_each_model_and_batch():
    """Per (model, batch): measured / estimate's range, the longest context's speed over the
    shortest's beside the estimate's, the OOMs (not the skipped) and whether the estimate's largest
    batch puts each point where it fell; one point or none leaves the ratios out."""
    rows = [
        point("a", 1, 32, tok_s=45.0, est=90.0, cap=8),
        point("a", 1, 8, tok_s=60.0, est=100.0, cap=9),
        point("a", 8, 8, tok_s=300.0, est=400.0, cap=9),
        point("a", 8, 32, cap=2),
        point("a", 8, 64, cap=1, skipped=True),
        point("b", 2, 8, tok_s=50.0, est=50.0, cap=1),
        point("c", 4, 8, cap=8),
    ]
    got = {(s["model"], s["batch"]): s for s in bench.summary(rows)}
    assert list(got) == [("a", 1), ("a", 8), ("b", 2), ("c", 4)]
    a1 = got["a", 1]
    assert a1["contexts"] == [8, 32] and a1["of_estimate"] == pytest.approx([0.5, 0.6])
    assert a1["kept"] == pytest.approx(0.75) and a1["estimate_kept"] == pytest.approx(0.9)
    assert a1["oom"] == [] and a1["as_estimated"]
    a8 = got["a", 8]
    assert a8["oom"] == [32] and a8["as_estimated"]
    assert a8["kept"] is None and a8["of_estimate"] == [0.75, 0.75]
    assert not got["b", 2]["as_estimated"]  # it ran at batch 2 where the estimate's largest is 1
    c = got["c", 4]
    assert c["contexts"] == [] and c["oom"] == [8] and not c["as_estimated"]  # it expected batch 4 to fit
    assert summary_table(bench.summary(rows)).row_count == 4


def test_autotuners_keep_their_results_on_disk():
    """Every autotuner the kernels make (on a GPU: the interpreter never tunes) stores its timings
    in Triton's on-disk cache, because `lt2dsl.kernels` turns the switch on before making them."""
    code = (
        "import triton, lt2dsl.kernels.fused.triton_norm as m\n"
        "ats = [v for v in vars(m).values() if isinstance(v, triton.runtime.Autotuner)]\n"
        "assert ats and all(a.cache_results for a in ats), ats\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


def test_bench_decode_keeps_each_point_as_it_is_measured(toy, tmp_path, monkeypatch, capsys):
    """The JSON is rewritten after every point, so a run stopped midway keeps the points it measured;
    on a log (stderr not a terminal) each point is a line."""
    out_json = tmp_path / "decode.json"
    real, seen = bench.measure, []

    def measure(engine, batch, ctx, plan, step_bytes):
        if seen:  # the second point: the first is on disk already
            assert [p["ctx"] for p in json.loads(out_json.read_text())["points"]] == [8]
            raise KeyboardInterrupt
        seen.append(ctx)
        return real(engine, batch, ctx, plan, step_bytes)

    monkeypatch.setattr(bench, "measure", measure)
    argv = ["bench", "decode", str(toy), "--ctx", "8,16", "--batch", "1", "--steps", "1", "--warm", "0"]
    assert main([*argv, "--json", str(out_json), "--device", "cpu"]) == 130  # interrupted
    assert [p["ctx"] for p in json.loads(out_json.read_text())["points"]] == [8]
    assert "toy B=1 L=8: " in capsys.readouterr().err
