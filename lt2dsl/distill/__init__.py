"""Distillation: a pretrained (looped) transformer into an LT2 student — `lt2dsl distill CONFIG.toml`,
or from Python:

    from lt2dsl.distill import init_student, run
    result = run("runs/gdn.toml")                   # stages, baseline, report
    init_student(teacher, student)                  # two LT2Models whose blocks line up

`lineup.py` pairs the blocks, `init.py` starts the student from the teacher (each kind's
`LayerSpec.from_attention`), `objectives.py` holds the stages' losses as trainer objectives,
`select.py` the KL-guided layer selection, `pipeline.py` runs them, `report.py` reports. User
guide: docs/distill.md. The names below are imported on first use, so `lt2dsl.distill.cli` starts
without torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lt2dsl.distill.config import DistillConfig, load_config
    from lt2dsl.distill.init import InitReport, init_student
    from lt2dsl.distill.lineup import Mismatch, line_up
    from lt2dsl.distill.pipeline import DistillResult, run

__all__ = [
    "DistillConfig",
    "DistillResult",
    "InitReport",
    "Mismatch",
    "init_student",
    "line_up",
    "load_config",
    "run",
]
_HOME = {
    "DistillConfig": "config",
    "load_config": "config",
    "InitReport": "init",
    "init_student": "init",
    "Mismatch": "lineup",
    "line_up": "lineup",
    "DistillResult": "pipeline",
    "run": "pipeline",
}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'lt2dsl.distill' has no attribute {name!r}")
    return getattr(import_module(f"lt2dsl.distill.{_HOME[name]}"), name)
