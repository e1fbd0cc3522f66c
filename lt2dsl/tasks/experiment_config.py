"""The experiment file: one TOML per claim, a list of runs sharing data, optimizer and training.

    name = "c_copy"
    claim = "a trainable Toeplitz mixer copies 512 tokens; a frozen one does not"
    seeds = [0, 1, 2]
    metrics = ["copy/accuracy"]            # the table's columns and the PNG's panels

    [optimizer]                            # AdamW, warm-up then cosine decay
    lr = 1e-3
    [training]
    steps = 2000
    batch_size = 32
    [[data]]                               # a task table (lt2dsl.tasks), plus `name` and `eval`
    name = "copy"
    task = "copy"
    length = 512
    [[runs]]
    name = "tmm"
    model = "c_tmm.lt2"                    # relative to this file
    [[runs]]
    name = "tmm frozen"
    model = "c_tmm.lt2"
    freeze = ["blocks.*.mixers.*.w", "blocks.*.mixers.*.bias"]
    [[checks]]                             # the claim's direction, judged on the seed means
    says = "the trainable Toeplitz mixer copies"
    metric = "copy/accuracy"
    kind = "at_least"
    run = "tmm"
    value = 0.9

Each (run, data entry, seed) is one `lt2dsl.train` run of the `TrainConfig` that `train_config`
makes (its sections are written into the run's result file).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lt2dsl.tasks import parse_config
from lt2dsl.tasks.base import TaskConfig

Closed = ConfigDict(frozen=True, extra="forbid")


class OptimConfig(BaseModel):
    """`[optimizer]`: AdamW (decay on weight matrices only) with warm-up, then cosine decay."""

    model_config = Closed
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.1, ge=0, description="on weight matrices only")
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = Field(100, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr / lr of the cosine decay")
    grad_clip: float = Field(1.0, gt=0)


class RunConfig(BaseModel):
    """`[[runs]]`: one model of the comparison."""

    model_config = Closed
    name: str
    model: str = Field(description="the .lt2 file, relative to the experiment file")
    overrides: dict[str, int | float | bool | str] = Field(default_factory=dict, description="--set style")
    freeze: list[str] = Field(default_factory=list, description="parameter-name globs kept at init")


class DataEntry(BaseModel):
    """`[[data]]`: a task table plus its `name` (the metric prefix), extra evaluations, and the
    training budget where it differs from `[training]`'s."""

    model_config = ConfigDict(frozen=True, extra="allow")
    name: str
    eval: list[dict[str, Any]] = Field(default_factory=list, description="task keys changed for extra evals")
    steps: int | None = Field(None, ge=1, description="training steps on this entry [training.steps]")
    batch_size: int | None = Field(
        None, ge=1, description="rows per step on this entry [training.batch_size]"
    )

    def task(self) -> TaskConfig:
        return parse_config(dict(self.model_extra or {}))

    def eval_tasks(self) -> dict[str, TaskConfig]:
        """metric prefix → task config: the trained config, then each `eval` change."""
        base = dict(self.model_extra or {})
        out = {self.name: parse_config(base)}
        for change in self.eval:
            label = ",".join(f"{k}={v}" for k, v in change.items())
            out[f"{self.name}/{label}"] = parse_config(base | change)
        return out

    def metric_names(self) -> list[str]:
        """The metrics a training on this entry reports (`lt2dsl.tasks.experiment.metrics_of`)."""
        names = []
        for prefix, task in self.eval_tasks().items():
            names.append(f"{prefix}/accuracy")
            variants = task.eval_variants()
            if len(variants) > 1:
                names += [f"{prefix}/{v}/accuracy" for v in variants]
        if self.task().curriculum() is not None:
            names += [f"{self.name}/stage", f"{self.name}/solved"]
        return names


class TrainingConfig(BaseModel):
    """`[training]`."""

    model_config = Closed
    steps: int = Field(2000, ge=1)
    batch_size: int = Field(32, ge=1)
    eval_batches: int = Field(8, ge=1)
    eval_batch_size: int = Field(32, ge=1)
    log_every: int = Field(100, ge=1)
    backend: Literal["auto", "reference", "triton"] = "auto"
    precision: Literal["fp32", "bf16"] = Field("fp32", description="the trainer's `training.precision`")
    cuda_graph: bool = Field(False, description="the trainer's `training.cuda_graph`")


class CheckConfig(BaseModel):
    """`[[checks]]`: one direction of the claim, judged on the means over seeds.

    `greater`: run's metric > than's; `at_least` / `at_most`: run's metric against `value`.
    """

    model_config = Closed
    says: str
    metric: str
    kind: Literal["greater", "at_least", "at_most"]
    run: str
    than: str | None = None
    value: float | None = None

    @model_validator(mode="after")
    def _operands(self):
        if (self.kind == "greater") != (self.than is not None) or (self.kind != "greater") != (
            self.value is not None
        ):
            raise ValueError("`greater` takes `than` (a run); `at_least` / `at_most` take `value`")
        return self


class ExperimentConfig(BaseModel):
    """One claim's experiment (module docstring)."""

    model_config = Closed
    name: str
    claim: str
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    metrics: list[str] = Field(min_length=1)
    equal_params: float | None = Field(0.02, description="largest relative spread of parameter counts")
    optimizer: OptimConfig = Field(default_factory=OptimConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    data: list[DataEntry] = Field(min_length=1)
    runs: list[RunConfig] = Field(min_length=1)
    checks: list[CheckConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self):
        runs = [r.name for r in self.runs]
        if len(set(runs)) != len(runs) or len({d.name for d in self.data}) != len(self.data):
            raise ValueError("run names and data names must be unique")
        for c in self.checks:
            for name in (c.run, c.than):
                if name is not None and name not in runs:
                    raise ValueError(f"check {c.says!r} names run {name!r}, not one of {runs}")
        known = [m for d in self.data for m in d.metric_names()]
        for m in [*self.metrics, *(c.metric for c in self.checks)]:
            if m not in known:
                raise ValueError(f"metric {m!r} is not one the data entries report: {known}")
        return self


def load_experiment(path: str | Path) -> tuple[ExperimentConfig, Path]:
    """(config, folder of the file). ValueError naming the problem for a bad file."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"cannot read `{path}`: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"`{path}` is not valid TOML: {e}") from None
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ValueError(f"`{path}`: {problems}") from None
    return cfg, path.parent


def train_config(
    exp: ExperimentConfig,
    run: RunConfig,
    data: DataEntry,
    seed: int,
    root: Path,
    device: str,
    out: Path,
    cuda_graph: bool | None = None,
):
    """The `lt2dsl.train.TrainConfig` of one training: the run's model (its overrides and frozen
    parameters), the data entry's task, the experiment's optimizer and budget, no checkpoints;
    `device` is "cpu" or "cuda", `out` the trainer's run folder, `cuda_graph` (default
    `[training] cuda_graph`) the trainer's whole-step graphs."""
    from lt2dsl.train.config import validate

    o, t = exp.optimizer, exp.training
    steps, batch_size = budget(exp, data)
    optimizer = {"lr": o.lr, "weight_decay": o.weight_decay, "betas": o.betas, "grad_clip": o.grad_clip}
    metrics = {"log_interval": t.log_every, "eval_rows": t.eval_batch_size, "progress": False, "plot": False}
    return validate(
        {
            "model": {
                "file": str(root / run.model),
                "set": dict(run.overrides),
                "backend": t.backend,
                "freeze": list(run.freeze),
            },
            "data": dict(data.model_extra or {}),
            "training": {
                "steps": steps,
                "batch_size": batch_size,
                "seed": seed,
                "precision": t.precision,
                "cuda_graph": t.cuda_graph if cuda_graph is None else cuda_graph,
                "device": device,
                "out": str(out),
            },
            "optimizer": optimizer,
            "scheduler": {"kind": "cosine", "warmup_steps": o.warmup_steps, "min_lr_ratio": o.min_lr_ratio},
            "checkpoint": {"enable": False},
            "metrics": metrics,
        },
        f"{exp.name}: run {run.name!r}",
    )


def budget(exp: ExperimentConfig, data: DataEntry) -> tuple[int, int]:
    """(steps, batch_size) of a training on `data`: the entry's own, else `[training]`'s."""
    return data.steps or exp.training.steps, data.batch_size or exp.training.batch_size
