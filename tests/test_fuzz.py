"""Random and mutated `.lt2` text through the CLI, in-process: a diagnostic, never a crash.

Mutations of valid files (`lt2dsl.fuzz.mutants`: a token deleted, duplicated or swapped with its
neighbour, random characters inserted (NUL and a BOM among them), the text truncated, a
character replaced) and random byte strings go through `lt2dsl check` and `lt2dsl fmt --check`.
Every run must end with exit code 1 and at least one `error[...]` diagnostic, or — when the
mutation happens to leave a valid program — exit code 0 and no error; never an internal error
(exit 3), never a traceback, never a raw control character echoed. The seed is fixed, so a
failure reproduces. `python -m lt2dsl.fuzz` runs the same at the sizes of docs/reliability.md.
"""

import random
import re
from pathlib import Path

import pytest

from lt2dsl.frontend import load
from lt2dsl.fuzz import mutants
from lt2dsl.fuzz.runner import run_cli

ROOT = Path(__file__).resolve().parents[1]
N = 300
# Control characters other than newline and tab must never reach the terminal raw.
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def inputs() -> list[bytes]:
    return mutants.inputs(mutants.seeds(ROOT), N, random.Random(20260101))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[tuple[bytes, int, str]]:
    work = str(tmp_path_factory.mktemp("fuzz"))
    out = []
    for data in inputs():
        o = run_cli(["check"], data, work)
        assert not o.escaped, (data, o.escaped)
        out.append((data, o.status, o.stderr))
    return out


def test_never_an_internal_error(results):
    for data, status, err in results:
        assert status in (0, 1), (data, status, err)
        assert "E9999" not in err and "Traceback" not in err, (data, err)


def test_errors_come_with_diagnostics(results):
    for data, status, err in results:
        if status == 1:
            assert re.search(r"^error\[E\d{4}\]: ", err, re.M), (data, err)
        else:
            assert "error[" not in err, (data, err)


def test_no_raw_control_characters_are_echoed(results):
    for data, _, err in results:
        assert not RAW_CONTROL.search(err), (data, err)


def test_the_api_agrees_with_the_cli(results):
    for data, status, _ in results[::10]:
        text = data.decode("utf-8", errors="replace")
        if status == 1 and data == text.encode():
            assert not load(text + "\n" if "\n" not in text else text).ok, data


def test_most_mutations_are_errors(results):
    errors = sum(status == 1 for _, status, _ in results)
    assert errors > 0.85 * len(results), f"only {errors} of {len(results)} inputs were errors"


def test_fmt_never_fails_internally(tmp_path):
    """`fmt --check` reads the same bytes: exit 0 or 1, a diagnostic for what it refuses."""
    for data in inputs()[::3]:
        o = run_cli(["fmt", "--check"], data, str(tmp_path))
        assert o.status in (0, 1) and not o.internal, (data, o.stderr, o.escaped)
        assert not RAW_CONTROL.search(o.stderr), (data, o.stderr)
