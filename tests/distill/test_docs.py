"""docs/distill.md: the generated reference is current, its example run file is valid, and the
README points to it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from lt2dsl.distill.config import validate
from lt2dsl.distill.docs import DOC, render_doc

TEXT = DOC.read_text(encoding="utf-8")


def test_reference_is_up_to_date():
    assert render_doc(TEXT) == TEXT, "docs/distill.md is stale: run `python -m lt2dsl.distill.docs`"


def test_example_run_file_is_valid_and_the_readme_links_the_guide():
    (block,) = re.findall(r"```toml\n(.*?)```", TEXT, re.S)
    cfg = validate(tomllib.loads(block))
    assert [s.kind for s in cfg.stages] == ["align", "select", "kd", "long"] and cfg.stages[1].keep == 0.25
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    assert "docs/distill.md" in readme
