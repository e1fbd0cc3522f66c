"""docs/language.md: generated half up to date, hand-written examples valid, every code and kind in it."""

import ast
import re
from pathlib import Path

import pytest

from lt2dsl.docs import DOC, MARKER, explain, render_doc
from lt2dsl.frontend import load
from lt2dsl.ir.registry import REGISTRY
from lt2dsl.validate.rules import SECTIONS, all_rules

TEXT = DOC.read_text(encoding="utf-8")
INTRO, GENERATED = TEXT.split(MARKER, 1)
BLOCKS = re.findall(r"```lt2\n(.*?)```", INTRO, re.S)


def test_generated_reference_is_up_to_date():
    assert render_doc(TEXT) == TEXT, "docs/language.md is stale: run `python -m lt2dsl.docs`"


@pytest.mark.parametrize("block", BLOCKS, ids=[f"example{i}" for i in range(len(BLOCKS))])
def test_hand_written_examples_are_valid(block):
    loaded = load(block)
    assert loaded.ok, loaded.render()


def test_there_are_examples_for_every_construct():
    joined = "\n".join(BLOCKS)
    for construct in (
        "model ",
        "let ",
        "loop T=",
        "repeat ",
        "par(",
        " * ",
        "exit=gate",
        "mlp=none",
        "#",
        "=2k",
        "1/2",
        '"entry"',
        "true",
        "1e-5",
    ):
        assert construct in joined, construct


def test_every_code_and_kind_is_in_the_reference():
    for code in all_rules():
        assert f"### {code}\n" in GENERATED, code
    for kind, spec in REGISTRY.items():
        assert f"### `{kind}`" in GENERATED
        for o in spec.options:
            assert f"| `{o.name}`" in GENERATED


@pytest.mark.parametrize("code", list(all_rules()))
def test_explain_pages(code):
    page = explain(code)
    assert page.startswith(f"{code} (")
    for section in SECTIONS:
        assert f"\n{section}:\n" in page


# --- The house documents: short, current, and naming only what the code reads ---

ROOT = Path(__file__).parents[1]
NAME = re.compile(r"LT2_[A-Z0-9_]+")
# a read: os.environ.get("X"), os.getenv("X"), os.environ["X"] not assigned, "X" in os.environ
READ = re.compile(
    r"""(?:environ\.get|getenv)\(\s*["'](LT2_[A-Z0-9_]+)"""
    r"""|environ\[\s*["'](LT2_[A-Z0-9_]+)["']\s*\](?!\s*=[^=])"""
    r"""|["'](LT2_[A-Z0-9_]+)["']\s+in\s+os\.environ"""
)
# the before-stop hook's pattern for comments that narrate past rounds of work
NARRATION = re.compile(
    r"(fifth|sixth|seventh|eighth|ninth|tenth|[a-z]+teenth|twent[a-z-]+|[0-9]+(st|nd|rd|th)) session"
    r"|\bs[0-9]+ call",
    re.I,
)


def _files(folder: str, suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in suffixes)


def _reads(code: str) -> set[str]:
    return {name for groups in READ.findall(code) for name in groups if name}


def _read_names() -> set[str]:
    """Every `LT2_*` name some Python file of the package, the tests or the bench reads."""
    names = set()
    for folder in ("lt2dsl", "tests", "bench"):
        for path in _files(folder, (".py",)):
            names |= _reads(path.read_text(encoding="utf-8"))
    return names


def _document_paths() -> list[Path]:
    """The documents, bench scripts and tests that may name `LT2_*` variables (not raw results)."""
    top = [ROOT / n for n in ("README.md", "CONTRIBUTING.md", "BENCHMARKS.md", "Makefile", "pyproject.toml")]
    docs = _files("docs", (".md",)) + _files("lt2dsl", (".md",))
    bench = [p for p in _files("bench", (".py", ".sh", ".md")) if "results" not in p.parts]
    tests = [p for p in _files("tests", (".py", ".md", ".sh", ".stderr", ".txt")) if p != Path(__file__)]
    return [p for p in top if p.exists()] + docs + bench + tests


def _stale(name: str, read: set[str]) -> bool:
    # `LT2_DELTA_…` names a family of variables: some read name must start with it
    return not any(r.startswith(name) for r in read) if name.endswith("_") else name not in read


def test_reads_are_told_from_writes():
    code = 'os.environ.get("LT2_A", "0"), os.getenv("LT2_B"), os.environ["LT2_C"], "LT2_D" in os.environ'
    assert _reads(code) == {"LT2_A", "LT2_B", "LT2_C", "LT2_D"}
    assert _reads('os.environ["LT2_E"] = "1"\nmonkeypatch.setenv("LT2_F", "1")') == set()
    assert {"LT2_DEBUG", "LT2_UPDATE_GOLDENS"} <= _read_names()


def test_no_document_names_an_environment_variable_the_code_does_not_read():
    read = _read_names()
    stale = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in _document_paths()
        for name in set(NAME.findall(path.read_text(encoding="utf-8", errors="replace")))
        if _stale(name, read)
    )
    assert not stale, "LT2_* names nothing reads:\n" + "\n".join(stale)


def _narrating(folder: Path) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{i}"
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".py", ".md"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if NARRATION.search(line)
    ]


def test_no_comment_outside_the_kernels_narrates_past_sessions():
    hits = [h for h in _narrating(ROOT / "lt2dsl") if not h.startswith("lt2dsl/kernels/")]
    assert not hits, "state the invariant and its reason instead (git keeps the history):\n" + "\n".join(hits)


def test_no_comment_in_the_kernels_narrates_past_sessions():
    hits = _narrating(ROOT / "lt2dsl" / "kernels")
    assert not hits, "state the invariant and its reason instead (git keeps the history):\n" + "\n".join(hits)


def test_benchmarks_is_a_report_not_a_log():
    lines = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300, f"BENCHMARKS.md has {len(lines)} lines: history lives in git"


def test_readme_is_short_and_opens_with_its_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 150
    before, block, after = re.split(r"```sh\n(.*?)```", text, maxsplit=1, flags=re.S)
    assert next(line for line in before.splitlines() if line.strip()) == "# lt2dsl"
    assert "\n#" not in before and len([line for line in before.splitlines() if line.strip()]) <= 2
    assert [line.split("#")[0].strip() for line in block.splitlines()] == ["make demo", "make test"]
    assert after.lstrip().startswith("`.ci/run` runs `make test`.")


def test_bench_does_not_import_tests():
    for path in _files("bench", (".py",)):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "tests" or n.startswith("tests.") for n in names), path
