"""One golden case per diagnostic code: `cases/<CODE>_<what>.lt2` and the `lt2dsl check` stderr.

A case's first line may be `# args: ...`: extra `lt2dsl check` arguments (e.g. `--set`).
Regenerate the `.stderr` files with `LT2_UPDATE_GOLDENS=1` and review the diff.
"""

import shlex
from pathlib import Path

import pytest

from lt2dsl.cli import main
from lt2dsl.ir.registry import REGISTRY
from lt2dsl.validate.rules import all_rules
from tests.golden import check_golden

CASES = Path(__file__).with_name("cases")
FILES = sorted(CASES.glob("*.lt2"))
# Codes no `.lt2` file can produce, and where they are tested instead.
NO_CASE = {
    "E0901": "an unreadable file: tests/test_frontend.py::test_unreadable_sources",
    "E9999": "an internal error: tests/test_cli.py::test_internal_error_is_reported_not_raised",
    "E0903": "a source over 128 KiB: tests/diagnostics/test_inputs.py::test_sources_over_the_size_limit",
    "E1001": "import: tests/hf/test_cli.py::test_unsupported_feature_is_a_diagnostic_naming_the_field",
    "E1002": "import: tests/hf/test_cli.py::test_weights_that_do_not_match_the_config_are_refused",
}
if not any(spec.kernel_note for spec in REGISTRY.values()):
    NO_CASE["W0402"] = (
        "no layer spec defines `kernel_note` yet: tests/validate/test_kernels.py::test_kernel_note_mechanism"
    )


def code_of(path: Path) -> str:
    return path.name.split("_", 1)[0]


def run_check(path: Path, capsys, monkeypatch) -> tuple[int, str, str]:
    first = path.read_text().split("\n", 1)[0]
    extra = shlex.split(first.removeprefix("# args:")) if first.startswith("# args:") else []
    monkeypatch.chdir(CASES)
    status = main(["check", path.name, *extra])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_case(path, capsys, monkeypatch):
    code = code_of(path)
    status, out, err = run_check(path, capsys, monkeypatch)
    assert out == ""
    assert f"[{code}]" in err, err
    assert "E9999" not in err
    if code.startswith("E"):
        assert status == 1
    else:
        assert status == 0 and "error[" not in err
    check_golden(path.with_suffix(".stderr"), err)


def test_every_code_has_a_case():
    have = {code_of(p) for p in FILES}
    missing = set(all_rules()) - have - set(NO_CASE)
    assert not missing, f"codes without a case file in {CASES}: {sorted(missing)}"
    assert not set(NO_CASE) & have, "a code listed in NO_CASE has a case now: drop it from NO_CASE"


def test_every_case_names_a_known_code():
    assert {code_of(p) for p in FILES} <= set(all_rules())
