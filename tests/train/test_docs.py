"""docs/train.md: the generated run-file reference is current, and its example run file is valid."""

from __future__ import annotations

import re
import tomllib

from lt2dsl.train.config import validate
from lt2dsl.train.docs import DOC, render_doc

TEXT = DOC.read_text(encoding="utf-8")


def test_reference_is_up_to_date():
    assert render_doc(TEXT) == TEXT, "docs/train.md is stale: run `python -m lt2dsl.train.docs`"


def test_example_run_file_is_valid():
    (block,) = re.findall(r"```toml\n(.*?)```", TEXT, re.S)
    cfg = validate(tomllib.loads(block))
    assert cfg.scheduler.kind == "wsd" and cfg.training.activation_checkpoint == "per_application"
