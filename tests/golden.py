"""Golden files: compare text output with a file beside the test, or rewrite it.

`check_golden(path, actual)` fails when `path` differs from `actual` (or is missing). With
`LT2_UPDATE_GOLDENS=1` it writes `actual` to `path` instead; review the diff before committing.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path


def updating() -> bool:
    return os.environ.get("LT2_UPDATE_GOLDENS", "") not in ("", "0")


def check_golden(path: Path, actual: str) -> None:
    path = Path(path)
    if updating():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != actual:
            path.write_text(actual, encoding="utf-8")
        return
    if not path.exists():
        raise AssertionError(f"missing golden file {path}; run with LT2_UPDATE_GOLDENS=1 to create it")
    expected = path.read_text(encoding="utf-8")
    if expected != actual:
        old, new = expected.splitlines(keepends=True), actual.splitlines(keepends=True)
        diff = "".join(difflib.unified_diff(old, new, str(path), "actual"))
        raise AssertionError(f"output differs from {path} (LT2_UPDATE_GOLDENS=1 rewrites it):\n{diff}")
