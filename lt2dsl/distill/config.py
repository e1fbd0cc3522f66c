"""`DistillConfig`: one distillation run — a teacher, a student, and the stages between them.

A run is a TOML file. `[teacher]` and `[student]` name the models; `[data]`, `[training]`,
`[optimizer]`, `[scheduler]`, `[checkpoint]` and `[metrics]` are the trainer's own sections
(docs/train.md), shared by every stage; each `[[stages]]` entry is one step of the run, in order,
and may override the steps, learning rate, batch and row length:

    [teacher]
    file = "teacher.lt2"
    weights = "runs/teacher"            # a trainer run, a step-N/ folder or a .safetensors file

    [student]
    file = "student_gdn.lt2"

    [[stages]]
    kind = "align"
    steps = 200

    [[stages]]
    kind = "select"
    keep = 0.25

    [[stages]]
    kind = "kd"
    steps = 1000

Every model forbids unknown keys, so a typo is an error naming the field.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from lt2dsl.tasks import parse_config as parse_task
from lt2dsl.train.checkpoint import CheckpointConfig
from lt2dsl.train.config import AnyData, TrainingSection
from lt2dsl.train.config import _field_errors as field_errors
from lt2dsl.train.data import TaskDataConfig
from lt2dsl.train.metrics import MetricsConfig
from lt2dsl.train.optim import OptimConfig, SchedulerConfig

STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)
Backend = Literal["auto", "reference", "triton"]


class TeacherSection(BaseModel):
    """The teacher: a `.lt2` program with its weights, or a Hugging Face checkpoint folder."""

    model_config = STRICT

    file: Path | None = None
    """The teacher's `.lt2` program (with `weights`)."""
    weights: Path | None = None
    """Its weights: a `.safetensors` file under `LT2Model`'s names, a trainer checkpoint folder
    (`step-N/`), or a trainer run folder (its newest complete checkpoint)."""
    hf: Path | None = None
    """Instead of `file` and `weights`: a local Hugging Face checkpoint folder
    (`lt2dsl.from_pretrained`), or an `LT2ForCausalLM` folder written by `save_pretrained`."""
    backend: Backend = "auto"
    """Kernel backend of the teacher's mixers."""

    @model_validator(mode="after")
    def _one_source(self) -> TeacherSection:
        if self.hf is not None and (self.file is not None or self.weights is not None):
            raise ValueError("give either `hf` or `file` with `weights`, not both")
        if self.hf is None and (self.file is None or self.weights is None):
            raise ValueError("give `file` and `weights` (or `hf`)")
        return self


class StudentSection(BaseModel):
    """The student: a `.lt2` program whose blocks line up with the teacher's."""

    model_config = STRICT

    file: Path
    """The student's `.lt2` program (relative paths are read from the config file's folder)."""
    set: dict[str, Any] = Field(default_factory=dict)
    """Setting overrides, as `lt2dsl compile --set` takes them."""
    backend: Backend = "auto"
    """Kernel backend of the student's mixers."""
    weights: Path | None = None
    """Start from these weights instead of from the teacher: a `.safetensors` file, a checkpoint or
    a stage folder of an earlier run (one `align` reused by several later runs)."""


class StageBase(BaseModel):
    model_config = STRICT

    steps: int = Field(gt=0)
    """Optimizer steps of this stage."""
    lr: float | None = Field(default=None, gt=0)
    """Peak learning rate of this stage [optimizer.lr]."""
    batch_size: int | None = Field(default=None, gt=0)
    """Rows per step [training.batch_size]."""
    seq_len: int | None = Field(default=None, gt=0)
    """Tokens per row [data.seq_len]."""


class AlignStage(StageBase):
    """Each replaced mixer against the teacher's attention output on the teacher's own residual
    stream: mean ‖t − s‖·D^-½; only the replaced mixers train."""

    kind: Literal["align"]
    """The stage's kind."""
    train: Literal["mixers"] = "mixers"
    """What trains: the replaced mixers."""


class HiddenStage(StageBase):
    """Each block's output against the teacher block's on the teacher's block input."""

    kind: Literal["hidden"]
    """The stage's kind."""
    train: Literal["mixers", "blocks", "all"] = "blocks"
    """What trains: the replaced mixers, the blocks holding them, or everything."""


class KdStage(StageBase):
    """KL to the teacher's logits plus next-token loss, chunked."""

    kind: Literal["kd"]
    """The stage's kind."""
    train: Literal["mixers", "blocks", "all"] = "all"
    """What trains: the replaced mixers, the blocks holding them, or everything."""
    kl_weight: float = Field(default=1.0, ge=0)
    """Weight of τ²·KL(teacher ‖ student)."""
    ce_weight: float = Field(default=1.0, ge=0)
    """Weight of the next-token cross-entropy."""
    temperature: float = Field(default=1.0, gt=0)
    """τ of the KL term."""


class LongStage(KdStage):
    """Continued training at a longer row length (`seq_len` required); next-token loss unless
    `kl_weight` > 0."""

    kind: Literal["long"]  # type: ignore[assignment]
    """The stage's kind."""
    seq_len: int = Field(gt=0)  # type: ignore[assignment]
    """Tokens per row of this stage."""
    kl_weight: float = Field(default=0.0, ge=0)
    """Weight of τ²·KL(teacher ‖ student); 0: the teacher does not run."""


class SelectStage(BaseModel):
    """KL-guided layer selection: keep the replaced layers whose swap raises the output KL most as
    the teacher's attention, and write them into the student's `.lt2`."""

    model_config = STRICT

    kind: Literal["select"]
    """The stage's kind."""
    keep: float = Field(default=0.25, ge=0, le=1)
    """Share of the replaced layers kept as attention (rounded half up, at least one when > 0)."""
    method: Literal["kl", "random"] = "kl"
    """kl: the largest KL increases; random: as many drawn with `seed` (the ablation baseline)."""
    seed: int = Field(default=0, ge=0)
    """Seed of the `random` draw."""
    rows: int = Field(default=16, gt=0)
    """Held-out rows the KL is measured on."""


Stage = Annotated[AlignStage | HiddenStage | KdStage | LongStage | SelectStage, Field(discriminator="kind")]
TRAINING_STAGES = ("align", "hidden", "kd", "long")

_training_fields = {k: (f.annotation, f) for k, f in TrainingSection.model_fields.items() if k != "steps"}
_training_fields["out"] = (
    Path,
    Field(default=Path("runs/distill"), description="Run folder: one subfolder per stage, the report."),
)
DistillTraining = create_model(
    "DistillTraining",
    __config__=STRICT,
    __doc__="The trainer's `[training]` section without `steps` (each stage has its own).",
    **_training_fields,
)


class ReportSection(BaseModel):
    """The end-of-run report."""

    model_config = STRICT

    baseline: bool = True
    """Also train a randomly initialised student of the final shape on as many tokens, to compare."""
    eval_rows: int = Field(default=64, gt=0)
    """Held-out rows of the perplexity and KL figures."""
    estimate_seq: int | None = Field(default=None, gt=0)
    """Context length of the side-by-side estimate [the longest stage row length]."""
    export_hf: bool = True
    """Write the final student as an `LT2ForCausalLM` folder `<out>/student/` (needs the hf extra)."""
    plot: bool = True
    """Write `losses.png` and `kl_ranking.png`."""


class DistillConfig(BaseModel):
    """A whole distillation run (see the module docstring)."""

    model_config = STRICT

    teacher: TeacherSection
    student: StudentSection
    data: AnyData
    training: DistillTraining = Field(default_factory=DistillTraining)  # type: ignore[valid-type]
    optimizer: OptimConfig = Field(default_factory=OptimConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    stages: list[Stage] = Field(min_length=1)
    report: ReportSection = Field(default_factory=ReportSection)

    @model_validator(mode="after")
    def _one_select(self) -> DistillConfig:
        if sum(s.kind == "select" for s in self.stages) > 1:
            raise ValueError("a run selects layers once: more than one `select` stage")
        return self

    @model_validator(mode="after")
    def _curriculum_needs_logits(self) -> DistillConfig:
        # a curriculum advances on the student's exact match, which only a stage whose student
        # predicts tokens (`kd`, `long`) can report; `align`/`hidden` match activations only
        if not isinstance(self.data, TaskDataConfig):
            return self
        if parse_task(self.data.task_dict()).curriculum() is None:
            return self
        bad = sorted({s.kind for s in self.stages if s.kind in ("align", "hidden")})
        if bad:
            raise ValueError(
                f"task `{self.data.task}` trains on a curriculum, which advances on the student's "
                f"predictions, but {' and '.join(f'`{k}`' for k in bad)} stages predict no tokens: "
                "use `kd`/`long` stages, or fix the task's length (no curriculum)"
            )
        return self


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> DistillConfig:
    """Read a TOML run file; relative paths are taken from its folder; `overrides` are dotted keys
    (`training.out`) applied on top.

    Raises:
        ValueError: the file cannot be read or parsed, or a field is wrong (named in the message).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"cannot read `{path}`: {'not a file' if path.exists() else 'no such file'}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None
    for key, value in (overrides or {}).items():
        *parents, last = key.split(".")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return rebase(validate(raw, str(path)), path.parent)


def validate(raw: dict[str, Any], where: str = "config") -> DistillConfig:
    """`DistillConfig` of a dict; ValueError listing each bad field as `section.key: problem`."""
    try:
        return DistillConfig.model_validate(raw)
    except ValidationError as e:
        # pydantic names the stage's kind after its index (`stages.0.long.seq_len`): drop it
        errors = [
            re.sub(r"(`stages\.\d+)\.(?:align|hidden|kd|long|select)\b", r"\1", x) for x in field_errors(e)
        ]
        raise ValueError(f"{where}: " + "; ".join(errors)) from None


def rebase(cfg: DistillConfig, root: Path) -> DistillConfig:
    """Paths in the config taken relative to `root` (the config file's folder)."""

    def at(p: Path | None) -> Path | None:
        return p if p is None or p.is_absolute() else root / p

    t, s = cfg.teacher, cfg.student
    teacher = t.model_copy(update={"file": at(t.file), "weights": at(t.weights), "hf": at(t.hf)})
    student = s.model_copy(update={"file": at(s.file), "weights": at(s.weights)})
    training = cfg.training.model_copy(update={"out": at(cfg.training.out)})
    return cfg.model_copy(
        update={"teacher": teacher, "student": student, "training": training, "data": cfg.data.rebase(root)}
    )
