"""Training for lowered `.lt2` models: `lt2dsl train CONFIG.toml`, or from Python:

    from lt2dsl.train import TrainConfig, run
    result = run("runs/gdn_dsa.toml")

`config.py` composes each component's config (`data.py`, `optim.py`, `checkpoint.py`,
`parallel.py`, `metrics.py`); `loop.py` runs them. User guide: docs/train.md. The names below are
imported on first use, so `lt2dsl.train.cli` (the command line's arguments) starts without torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lt2dsl.train.config import TrainConfig, load_config
    from lt2dsl.train.loop import RunResult, run

__all__ = ["RunResult", "TrainConfig", "load_config", "run"]
_HOME = {"TrainConfig": "config", "load_config": "config", "RunResult": "loop", "run": "loop"}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'lt2dsl.train' has no attribute {name!r}")
    return getattr(import_module(f"lt2dsl.train.{_HOME[name]}"), name)
