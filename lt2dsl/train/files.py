"""Atomic file writes: a reader sees the old file or the whole new one, never a part."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write `data` to a temporary file in `path`'s folder, then rename it over `path`."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(tmp, path)
