"""The one module of lt2dsl that reads environment variables: debugging switches, never behaviour.

| variable | read by | effect |
|---|---|---|
| `LT2_DEBUG` | `debug_level()` | 1: the traceback of an internal error, each front-end pass with its time, the fusion rules that fired; 2: also the IR after each pass and the graph before and after fusion |
| `LT2_POISON` | `poison()` | 1: every kernel output and scratch buffer starts as NaN, so an element a kernel forgets to write fails a comparison instead of passing on leftover memory |
| `TRITON_INTERPRET` | `triton_interpreting()` | Triton's own: kernels run on its CPU interpreter |
| `WORLD_SIZE`, `RANK`, `LOCAL_RANK` | `torchrun_ranks()` | torchrun's: the process's place in a distributed run |

Which kernel variant runs is a recipe (each kernel family's `recipe.py`), chosen from the shape,
dtype and device or named by the caller, never an environment variable. Each function reads the
variable at the call, so a test may set it with `monkeypatch.setenv`.
"""  # noqa: E501

from __future__ import annotations

import os


def debug_level() -> int:
    """`LT2_DEBUG` as a level (0 when unset; 1 for a value that is not a number)."""
    try:
        return int(os.environ.get("LT2_DEBUG", "0") or 0)
    except ValueError:
        return 1


def poison() -> bool:
    """Whether kernel buffers start as NaN (`LT2_POISON=1`)."""
    return os.environ.get("LT2_POISON", "0") not in ("", "0")


def triton_interpreting() -> bool:
    """True when Triton kernels run through the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def torchrun_ranks() -> tuple[int, int, int]:
    """(world size, global rank, local rank) that torchrun gives this process; (1, 0, 0) outside it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world, int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
