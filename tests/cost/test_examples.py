"""Every example checks and estimates, against a golden report; the research's headline claims
hold in the estimate."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from lt2dsl.cli import main
from tests.golden import check_golden

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.lt2"))
GOLDENS = Path(__file__).parent / "goldens"


def run(capsys, *argv) -> str:
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_estimate_matches_golden(path, capsys):
    check_golden(GOLDENS / f"{path.stem}.report", run(capsys, "compile", str(path), "--estimate"))


def test_sweep_against_the_standard_looped_transformer(capsys):
    out = run(
        capsys,
        "compile",
        str(ROOT / "examples/lt2_linear_gdn.lt2"),
        "--estimate",
        "--seq",
        "4k..32k",
        "--batch",
        "8",
        "--vs",
        str(ROOT / "examples/ouro_looped_transformer.lt2"),
    )
    check_golden(GOLDENS / "sweep_gdn_vs_ouro.report", out)


def test_card_line_with_dim_override(capsys, tmp_path):
    card = tmp_path / "card.lt2"
    card.write_text("loop T=4 < gdn; dsa(topk=64); full(gate=sdpa) >\n")
    out = run(capsys, "compile", str(card), "--set", "dim=2048", "--estimate", "--vs", "baseline")
    check_golden(GOLDENS / "card_vs_baseline.report", out)


def sweep(capsys, example: str) -> dict[int, dict]:
    data = json.loads(
        run(
            capsys,
            "compile",
            str(ROOT / "examples" / example),
            "--estimate",
            "--seq",
            "4k..32k",
            "--batch",
            "8",
            "--json",
        )
    )
    return {e["inputs"]["seq"]: e for e in data["sweep"]}


def test_decode_throughput_flat_for_lt2_and_halved_for_looped_attention(capsys):
    """The research headline, from the roofline: LT2-linear keeps its decode throughput from 4k
    to 32k; the standard looped transformer loses over half of it."""
    gdn = sweep(capsys, "lt2_linear_gdn.lt2")
    ouro = sweep(capsys, "ouro_looped_transformer.lt2")
    tps = lambda s, L: s[L]["roofline"]["decode_tokens_per_s"]  # noqa: E731
    assert tps(gdn, 32768) == pytest.approx(tps(gdn, 4096), rel=1e-3)
    assert tps(ouro, 32768) < 0.5 * tps(ouro, 4096)
    assert gdn[32768]["memory"]["kv_bytes"] == 0
    assert ouro[32768]["memory"]["kv_bytes"] == 8 * ouro[4096]["memory"]["kv_bytes"]


def test_json_has_the_documented_keys(capsys):
    path = str(ROOT / "examples/lt2_hybrid_gdn_dsa.lt2")
    d = json.loads(run(capsys, "compile", path, "--estimate", "--json"))
    for path in [
        "params.stored",
        "params.executed",
        "flops_per_token.prefill",
        "flops_per_token.decode",
        "flops_per_token.train",
        "memory.weights_bytes",
        "memory.state_bytes",
        "memory.kv_bytes",
        "roofline.prefill_tokens_per_s",
        "roofline.decode_tokens_per_s",
    ]:
        v = d
        for part in path.split("."):
            v = v[part]
        assert isinstance(v, int | float) and v > 0, path
    assert len(d["blocks"]) == 24 and all(b["iterations"] == 4 for b in d["blocks"])


def test_csv_and_markdown(capsys):
    path = str(ROOT / "examples/kda_hybrid.lt2")
    rows = list(csv.DictReader(io.StringIO(run(capsys, "compile", path, "--estimate", "--csv"))))
    total = [r for r in rows if r["id"] == "TOTAL"]
    assert len(total) == 1 and int(total[0]["params_stored"]) == sum(
        int(r["params_stored"]) for r in rows if r["id"] != "TOTAL"
    )
    md = run(capsys, "compile", path, "--estimate", "--md")
    assert md.count("| loop0/") == 24 and "Conventions:" in md


def test_expand_gives_one_row_per_iteration(capsys):
    d = json.loads(
        run(capsys, "compile", str(ROOT / "examples/kda_hybrid.lt2"), "--estimate", "--json", "--expand")
    )
    assert len(d["blocks"]) == 48
    assert (
        sum(b["params_stored"] for b in d["blocks"]) + sum(e["params_stored"] for e in d["extras"])
        == d["params"]["stored"]
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--seq", "0"],
        ["--seq", "8q"],
        ["--hw", "tpu9"],
        ["--batch", "0"],
        ["--exit-profile", "a,b"],
        ["--seq", "32k..4k"],
    ],
)
def test_bad_estimate_flags_are_usage_errors(argv, capsys):
    code = main(["compile", str(ROOT / "examples/retnet.lt2"), "--estimate", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and "Traceback" not in err


def test_user_hardware_file(capsys, tmp_path):
    hw = tmp_path / "mine.json"
    hw.write_text(
        json.dumps(
            {"name": "mine", "peak_flops": {"bf16": 1e12}, "hbm_bytes_per_s": 1e11, "memory_bytes": 16e9}
        )
    )
    d = json.loads(
        run(capsys, "compile", str(ROOT / "examples/retnet.lt2"), "--estimate", "--json", "--hw", str(hw))
    )
    assert d["inputs"]["hw"] == "mine"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["compile", str(ROOT / "examples/retnet.lt2"), "--estimate", "--hw", str(bad)]) == 2
