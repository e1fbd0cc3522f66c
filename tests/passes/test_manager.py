"""`PassManager`: passes in order, diagnostics collected, halts, and internal errors that name the pass."""

import pytest

from lt2dsl import frontend
from lt2dsl.cli import main
from lt2dsl.diagnostics import error
from lt2dsl.passes.manager import FunctionPass, InternalError, PassManager, PassResult


def step(name: str, halt: bool = False, code: str | None = None) -> FunctionPass:
    def run(trail: tuple) -> PassResult:
        diags = (error(code, f"from {name}"),) if code else ()
        return PassResult((*trail, name), diags, halt=halt)

    return FunctionPass(name, run)


def test_runs_in_order_and_collects_diagnostics():
    seen = []
    passes = [step("a", code="E0001"), step("b"), step("c", code="E0002")]
    pm = PassManager(passes, after_pass=lambda *a: seen.append(a))
    result = pm.run(())
    assert result.value == ("a", "b", "c") and not result.halt
    assert [d.code for d in result.diagnostics] == ["E0001", "E0002"]
    assert [(name, value[-1]) for name, _, value in seen] == [("a", "a"), ("b", "b"), ("c", "c")]


def test_a_halting_pass_stops_the_pipeline():
    result = PassManager([step("a"), step("b", halt=True, code="E0003"), step("c")]).run(())
    assert result.value == ("a", "b") and result.halt and [d.code for d in result.diagnostics] == ["E0003"]


def test_a_raising_pass_is_an_internal_error_naming_it_and_those_before():
    def boom(_):
        raise KeyError("x")

    pm = PassManager([step("parse"), step("overrides"), FunctionPass("resolve", boom), step("late")])
    with pytest.raises(InternalError) as e:
        pm.run(())
    assert str(e.value) == "internal error in pass `resolve` after [`parse`, `overrides`]"
    assert e.value.before == ("parse", "overrides") and isinstance(e.value.__cause__, KeyError)


def test_pass_names_are_unique():
    with pytest.raises(ValueError, match="unique"):
        PassManager([step("a"), step("a")])


def test_the_front_end_reports_a_failing_pass_as_an_internal_error(monkeypatch, tmp_path, capsys):
    def broken(_):
        raise AssertionError("unexpected node")

    monkeypatch.setattr(frontend, "resolve", broken)
    with pytest.raises(InternalError, match=r"pass `resolve` after \[`parse`, `overrides`, `validate`\]"):
        frontend.load("dim = 64\ngdn\n")
    f = tmp_path / "m.lt2"
    f.write_text("dim = 64\ngdn\n")
    assert main(["check", str(f)]) == 3
    assert "error[E9999]: internal compiler error: InternalError: internal error in pass `resolve`" in (
        capsys.readouterr().err
    )
