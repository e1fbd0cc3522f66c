"""The shipped examples are in canonical form: `lt2dsl fmt --check examples/*.lt2` passes."""

from pathlib import Path

from lt2dsl.cli import main

EXAMPLES = sorted(str(p) for p in (Path(__file__).resolve().parents[1] / "examples").glob("*.lt2"))


def test_examples_are_formatted(capsys):
    assert len(EXAMPLES) >= 10
    status = main(["fmt", "--check", *EXAMPLES])
    assert status == 0, capsys.readouterr().err
