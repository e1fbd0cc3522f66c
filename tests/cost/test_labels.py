"""The estimate's labels say what they measure: the block table's per-application columns, the
footer of `--mode` (only that mode's figures) and of a `--seq` sweep (the first length's)."""

import pytest

from lt2dsl.cli import main

MODEL = "model m {\n  dim = 256\n  max_len = 4k\n  loop T=4 < gdn; swa(window=128) >\n}\n"


@pytest.fixture
def report(tmp_path, capsys):
    f = tmp_path / "m.lt2"
    f.write_text(MODEL)

    def run(*flags: str) -> str:
        assert main(["compile", str(f), "--estimate", *flags]) == 0
        return capsys.readouterr().out

    return run


def test_the_block_table_says_its_columns_are_per_application(report):
    out = report()
    assert "per application (one iteration of a looped block): FLOP/tok, state/seq, KV/seq" in out
    assert "Per application" in report("--md")


@pytest.mark.parametrize(
    ("mode", "shown", "hidden"),
    [
        ("decode", ["decode memory-bound", "moved per step"], ["prefill compute", "train activations"]),
        ("prefill", ["prefill compute-bound"], ["decode memory", "train activations"]),
        ("train", ["train activations"], ["-bound"]),
        ("all", ["prefill compute-bound, decode memory-bound", "train activations"], []),
    ],
)
def test_the_footer_holds_the_modes_figures_only(report, mode, shown, hidden):
    footer = report("--mode", mode).split("totals", 1)[1]
    assert all(s in footer for s in shown), footer
    assert not any(h in footer for h in hidden), footer


def test_a_sweep_footer_says_which_length_it_describes(report):
    out = report("--seq", "1k,4k")
    assert "at L=1k, the sweep's first length:\n  prefill compute-bound, decode memory-bound" in out
