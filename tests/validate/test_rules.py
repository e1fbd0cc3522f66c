"""The rule registry: every code documented, every example reproduces its code."""

import pytest

from lt2dsl.frontend import check_program
from lt2dsl.grammar.parse import parse
from lt2dsl.ir.registry import REGISTRY
from lt2dsl.validate import KERNELS, SHAPES, SURFACE
from lt2dsl.validate.rules import RULES, SECTIONS, all_rules

PIPELINE = (*SURFACE, *SHAPES, *KERNELS)
NOT_PROGRAMS = ("syntax", "driver", "import", "internal")  # topics whose examples are not `.lt2` programs
CHECKS = {code: r for code, r in all_rules().items() if r.topic not in NOT_PROGRAMS}
NEEDS_NOTE = not any(s.kernel_note for s in REGISTRY.values())
# Codes whose example is abridged (it needs 65 lines), and where the whole one is tested.
ABRIDGED = {"E0206": "tests/validate/test_limits.py::test_let_chain_past_the_nesting_limit"}


def validate(program):
    """Every diagnostic of a parsed program, as the front end reports them."""
    return check_program(program).diagnostics


@pytest.mark.parametrize("code", list(all_rules()))
def test_every_code_is_documented(code):
    r = all_rules()[code]
    assert r.title and not r.title.endswith("."), code
    for section in SECTIONS:
        assert r.sections.get(section, "").strip(), f"{code}: no `{section}` section"


def test_every_check_runs_in_the_pipeline():
    assert {f.code for f in PIPELINE} == set(CHECKS)
    assert len(PIPELINE) == len(CHECKS)
    for f in PIPELINE:
        assert RULES[f.code].func is f and f.__name__.startswith("check_")


@pytest.mark.parametrize("code", list(CHECKS))
def test_example_reproduces_the_code_and_the_fix_does_not(code):
    if code == "W0402" and NEEDS_NOTE:
        pytest.skip("no layer spec defines kernel_note yet; tests/validate/test_kernels.py covers W0402")
    if code in ABRIDGED:
        pytest.skip(f"the example is abridged; {ABRIDGED[code]} covers it")
    r = CHECKS[code]
    program, errors = parse(r.sections["Example"])
    assert errors == [], errors
    assert code in [d.code for d in validate(program)], f"the example of {code} does not produce it"
    program, errors = parse(r.sections["Use instead"])
    assert errors == [], errors
    fixed = validate(program)
    assert code not in [d.code for d in fixed]
    assert not [d for d in fixed if d.is_error], fixed


def test_diagnostics_come_sorted_and_once():
    program, _ = parse("dim = 64\nlet a = gdn(heads=3)\nloop T=2 < a; a; zzz; a >\nyyy\n")
    ds = validate(program)
    keys = [d.sort_key() for d in ds]
    assert keys == sorted(keys)
    assert [d.code for d in ds] == ["E0101", "E0101"]


def test_check_program_returns_the_model_only_when_clean():
    program, _ = parse("dim = 64\ngdn\n")
    loaded = check_program(program)
    assert loaded.diagnostics == [] and loaded.model is not None and loaded.model.config.dim == 64
    program, _ = parse("dim = 64\ngdn(heads=0)\n")
    loaded = check_program(program)
    assert loaded.model is None and [d.code for d in loaded.diagnostics] == ["E0202"]
    assert check_program(program, {"dim": "1k2"}).model is None


def test_shape_rules_wait_for_clean_surface():
    # the kv_heads problem is reported only once the unknown layer is fixed
    program, _ = parse("dim = 64\nfull(heads=6, kv_heads=4)\nzzz\n")
    assert [d.code for d in validate(program)] == ["E0101"]
