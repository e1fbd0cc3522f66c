"""Synthetic tasks: seeded generators with exact answers, a length curriculum, evaluation by slice.

    from lt2dsl.tasks import build, evaluate
    source = build({"task": "state_tracking", "group": "s5"})    # a TOML `data = {...}` table
    ids, labels = source.batch(step=0, batch_size=32, seed=0)    # [B, T] each, -100: no loss
    report = evaluate(model, {"task": "mqar"})                   # accuracy overall and by slice

One file per task, each a pydantic config (`task` names it) and a pure numpy generator whose
docstring shows a worked example (checked by the tests): `state_tracking.py` (S5 / S3 / parity,
with the curriculum of `curriculum.py`), `mqar.py`, `copy.py`, `selective_copy.py`, `niah.py`.
User guide: docs/tasks.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from lt2dsl.tasks.base import IGNORE, TaskConfig, TaskData, show
from lt2dsl.tasks.copy import CopyConfig
from lt2dsl.tasks.mqar import MQARConfig
from lt2dsl.tasks.niah import NIAHConfig
from lt2dsl.tasks.selective_copy import SelectiveCopyConfig
from lt2dsl.tasks.source import TaskSource
from lt2dsl.tasks.state_tracking import StateTrackingConfig

if TYPE_CHECKING:
    from lt2dsl.tasks.eval import EvalReport

__all__ = [
    "IGNORE",
    "TASKS",
    "AnyTask",
    "EvalReport",
    "TaskConfig",
    "TaskData",
    "TaskSource",
    "build",
    "evaluate",
    "parse_config",
    "show",
]

TASKS: dict[str, type[TaskConfig]] = {
    c.model_fields["task"].default: c
    for c in (StateTrackingConfig, MQARConfig, CopyConfig, SelectiveCopyConfig, NIAHConfig)
}
AnyTask = Annotated[
    StateTrackingConfig | MQARConfig | CopyConfig | SelectiveCopyConfig | NIAHConfig,
    Field(discriminator="task"),
]
_ADAPTER = TypeAdapter(AnyTask)


def parse_config(cfg: dict[str, Any] | TaskConfig) -> TaskConfig:
    """A task config from a `data = { task = "...", ... }` table (or a config, returned as is).

    Raises:
        ValueError: an unknown task, an unknown key or a bad value, naming them.
        TypeError: `cfg` is neither a dict nor a task config.
    """
    if isinstance(cfg, TaskConfig):
        return cfg
    if not isinstance(cfg, dict):
        raise TypeError(f"a task config is a dict like {{'task': 'mqar', ...}}, got {type(cfg).__name__}")
    name = cfg.get("task")
    if name not in TASKS:
        raise ValueError(f"`task` must be one of {', '.join(TASKS)}, got {name!r}")
    try:
        return _ADAPTER.validate_python(cfg)
    except ValidationError as e:
        raise ValueError(f"bad `{name}` task config: {_explain(e)}") from None


def _explain(e: ValidationError) -> str:
    """`key: message` for each problem, one line."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"][1:])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        msg = msg.removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def build(cfg: dict[str, Any] | TaskConfig) -> TaskSource:
    """The batch source of a task config (`source.batch(step, batch_size, seed)`)."""
    return TaskSource(parse_config(cfg))


def evaluate(model, cfg: dict[str, Any] | TaskConfig, **kwargs) -> EvalReport:
    """Exact-match accuracy of `model` on the task's test split; see `lt2dsl.tasks.eval.evaluate`."""
    from lt2dsl.tasks.eval import evaluate as _evaluate

    return _evaluate(model, cfg, **kwargs)
