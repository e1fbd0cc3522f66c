"""`lt2dsl.frontend.load`: sources, overrides, diagnostics, debug output; never raises on input."""

from pathlib import Path

import pytest

from lt2dsl.diagnostics import DiagnosticError
from lt2dsl.frontend import is_path, load, load_or_raise
from lt2dsl.ir import nodes as n

MODEL = "model m {\n  dim = 256\n  loop T=2 < gdn; dsa(topk=64) >\n}\n"


def test_text_or_path(tmp_path, monkeypatch):
    f = tmp_path / "m.lt2"
    f.write_text(MODEL)
    assert is_path(f) and is_path(str(f))
    assert not is_path("gdn") and not is_path("loop T=2 < gdn >") and not is_path("dim = 3\ngdn")
    assert is_path("missing.lt2")
    loaded = load(f)
    assert loaded.ok and loaded.name == str(f) and str(f) in loaded.sources
    monkeypatch.chdir(tmp_path)
    assert load("m.lt2").model.config.name == "m"
    assert load("gdn", {"dim": "64"}).model.config.dim == 64


def test_errors_leave_no_model_but_keep_the_program():
    loaded = load("dim = 64\ngdn(heads=0)\n")
    assert loaded.model is None and loaded.program is not None and not loaded.ok
    assert [d.code for d in loaded.errors] == ["E0202"]
    assert "error[E0202]" in loaded.render()


def test_syntax_error_has_no_program():
    loaded = load("loop T=2 < gdn\n")
    assert loaded.program is None and [d.code for d in loaded.diagnostics] == ["E0005"]


def test_overrides_as_text_or_nodes():
    assert load(MODEL, {"dim": "512"}).model.config.dim == 512
    assert load(MODEL, {"dim": n.Int(value=128)}).model.config.dim == 128
    loaded = load(MODEL, {"loop.T": "8"})
    assert loaded.model.body[0].T == 8


def test_bad_override_is_a_diagnostic_with_its_own_source():
    loaded = load(MODEL, {"dim": "1k2"})
    (d,) = loaded.diagnostics
    assert d.code == "E0902" and d.span.file == "--set dim" and (d.span.col, d.span.end_col) == (5, 8)
    assert loaded.sources["--set dim"].text == "dim=1k2"
    assert "dim=1k2" in loaded.render()


def test_load_or_raise():
    assert load_or_raise(MODEL).model is not None
    with pytest.raises(DiagnosticError) as e:
        load_or_raise("dim = 64\nzzz\n")
    assert [d.code for d in e.value.diagnostics] == ["E0101"]
    assert "error[E0101]" in str(e.value)


def test_unreadable_sources(tmp_path):
    assert [d.code for d in load(tmp_path / "nope.lt2").diagnostics] == ["E0901"]
    assert [d.code for d in load(tmp_path).diagnostics] == ["E0901"]
    bad = tmp_path / "bad.lt2"
    bad.write_bytes(b"\xff\xfe\x00gdn")
    (d,) = load(bad).diagnostics
    assert d.code == "E0901" and "UTF-8" in d.message


@pytest.mark.parametrize(
    "text", ["\x00\x01", "}}}}", "model", "\n\n", "#", "let", '"', "loop T=9999999999 < >"]
)
def test_never_raises_on_bad_input(text):
    loaded = load(text + "\n")
    assert loaded.model is None and loaded.diagnostics


def test_debug_levels(monkeypatch, capsys):
    monkeypatch.setenv("LT2_DEBUG", "1")
    load(MODEL)
    err = capsys.readouterr().err
    names = ["parse", "overrides", "validate", "resolve", "validate-resolved"]
    assert [line.split("`")[1] for line in err.splitlines()] == names and "ms" in err
    monkeypatch.setenv("LT2_DEBUG", "2")
    load(MODEL)
    err = capsys.readouterr().err
    assert "IR after `parse`" in err and "model m {" in err


def test_examples_load_clean():
    for f in sorted(Path(__file__).resolve().parents[1].glob("examples/*.lt2")):
        loaded = load(f)
        assert loaded.ok, loaded.render()
