"""docs/language.md: generated half up to date, hand-written examples valid, every code and kind in it."""

import re

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
