"""`run(cfg)`: one distillation run — its stages in order, the random-init baseline, the report.

    from lt2dsl.distill import run
    result = run("runs/gdn.toml")                 # a path, a DistillConfig or a dict of sections
    result.stages[-1].losses, result.report["perplexity"]

Each stage works in `<out>/stages/<NN>-<kind>/`. A training stage (`align`, `hidden`, `kd`,
`long`) is one trainer run there (`lt2dsl.train.run` with the stage's objective,
`objectives.py`): the trainer's data, logging and `checkpoints/step-N/`. A `select` stage ranks
the layers and writes the hybrid program. Either ends by writing the student as it leaves the
stage — `student.lt2` and `model.safetensors` — and last `done.json`, which is what the next stage
(or a later run, `student.weights`) reads. `resume=True` skips the stages with a `done.json` and
continues an unfinished one from its newest checkpoint; without it a run refuses a folder that
already holds stages.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lt2dsl.distill import select
from lt2dsl.distill.config import DistillConfig, load_config, validate
from lt2dsl.distill.evaluate import heldout_batches, objective_loss, validation
from lt2dsl.distill.init import init_student, plan_init
from lt2dsl.distill.lineup import line_up
from lt2dsl.distill.objectives import KdTerms, StageObjective, frozen_teacher
from lt2dsl.distill.teacher import WEIGHTS, Loaded, build, load_into, load_teacher, read_weights
from lt2dsl.env import torchrun_ranks
from lt2dsl.train.build import build_model
from lt2dsl.train.config import ModelSection, TrainConfig, TrainingSection
from lt2dsl.train.data import DataConfig
from lt2dsl.train.files import atomic_write
from lt2dsl.train.loop import read_metrics
from lt2dsl.train.loop import run as train_run
from lt2dsl.train.objective import LMObjective
from lt2dsl.train.parallel import TrainModel, init_dist

DONE = "done.json"
PROGRAM = "student.lt2"


@dataclass
class StageResult:
    """One stage as it ended: the student it left (`student`, `weights`), its loss per logged step
    and held-out loss per evaluation (step 0: before its first step), and for `select` the scores
    and the chosen blocks."""

    index: int
    kind: str
    folder: Path
    student: Path
    weights: Path
    losses: dict[int, float] = field(default_factory=dict)
    evals: dict[int, float] = field(default_factory=dict)
    selection: dict | None = None


@dataclass
class DistillResult:
    out: Path
    stages: list[StageResult]
    baseline: StageResult | None
    report: dict


@dataclass(frozen=True)
class Current:
    """The student between two stages: its program and its weights (None: the teacher's, `init.py`)."""

    program: Path
    weights: Path | None


def run(
    cfg: DistillConfig | dict | str | Path,
    *,
    resume: bool = False,
    on_step: Callable[[int, int], None] | None = None,
) -> DistillResult:
    """Run a distillation (module docstring).

    Args:
        cfg: a `DistillConfig`, a dict of its sections, or the path of a TOML run file.
        resume (bool, Optional): continue the run in `training.out`. Default: `False`.
        on_step (callable, Optional): called as `on_step(stage number, step)` after every step.
    Raises:
        ValueError: a bad config, data or teacher; `Mismatch` (a ValueError) when the student does
            not line up with the teacher.
    """
    cfg = _config(cfg)
    if torchrun_ranks()[0] > 1:
        raise ValueError("`lt2dsl distill` runs on one process (not under torchrun with several)")
    out = cfg.training.out
    _check_fresh(out, resume)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "config.json", cfg.model_dump_json(indent=1))
    t = cfg.teacher
    teacher = load_teacher(t.file, t.weights, t.hf, t.backend)
    atomic_write(out / "teacher.lt2", teacher.text)
    first, as_written = _first_program(cfg, out)
    plan_init(teacher.model.ir, as_written)  # refused early, pointing at the user's own file
    current = Current(first, cfg.student.weights)
    results = []
    for k, stage in enumerate(cfg.stages, 1):
        folder = out / "stages" / f"{k:02d}-{stage.kind}"
        done = _read_done(folder, k) if resume else None
        if done is None:
            step = (lambda s, _r, k=k: on_step(k, s)) if on_step else None
            if stage.kind == "select":
                done = _select(cfg, stage, k, folder, teacher, current)
            else:
                done = _train(cfg, stage, k, folder, teacher, current, resume, step)
        results.append(done)
        current = Current(done.student, done.weights)
    baseline = _baseline(cfg, out, current, resume) if cfg.report.baseline else None
    from lt2dsl.distill.report import write_report

    report = write_report(cfg, teacher, results, baseline)
    return DistillResult(out, results, baseline, report)


def _config(cfg) -> DistillConfig:
    if isinstance(cfg, str | Path):
        return load_config(cfg)
    if isinstance(cfg, dict):
        return validate(cfg)
    if not isinstance(cfg, DistillConfig):
        raise TypeError(f"cfg must be a DistillConfig, a dict or a path, got {type(cfg).__name__}")
    return cfg


def _check_fresh(out: Path, resume: bool) -> None:
    stages = out / "stages"
    if not resume and stages.is_dir() and any(stages.iterdir()):
        raise ValueError(
            f"`{out}` already holds a distillation run: continue it with `--resume`, or choose "
            "another `training.out`"
        )


def _first_program(cfg: DistillConfig, out: Path):
    """`<out>/student.lt2`: the student's program with its `set` overrides written in, so every
    stage compiles the same text; and the resolved model of the file as written."""
    from lt2dsl.diagnostics import DiagnosticError
    from lt2dsl.frontend import load_or_raise
    from lt2dsl.ir.printer import print_program
    from lt2dsl.passes.overrides import applicable, apply_overrides, as_node

    s = cfg.student
    if not s.file.is_file():
        raise ValueError(f"student.file: cannot read `{s.file}`")
    try:
        loaded = load_or_raise(s.file, {k: as_node(v) for k, v in s.set.items()})
    except DiagnosticError as e:
        raise ValueError(f"student.file `{s.file}` has errors:\n{e}") from None
    path = out / PROGRAM
    atomic_write(path, print_program(apply_overrides(loaded.program, applicable(loaded.overrides))))
    return path, loaded.model


# ---- stages -------------------------------------------------------------------------------------


def train_config(
    cfg: DistillConfig,
    program: Path,
    out: Path,
    steps: int = 1,
    lr: float | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
) -> TrainConfig:
    """The trainer config of one stage (or of the baseline): the run's shared sections with the
    stage's overrides, the student's program, the stage's folder, the run's shared token cache."""
    training = cfg.training.model_dump() | {"steps": steps, "out": out}
    if batch_size:
        training["batch_size"] = batch_size
    data = cfg.data
    if isinstance(data, DataConfig):
        update = {"cache": data.cache or cfg.training.out / "data"}
        data = data.model_copy(update=update | ({"seq_len": seq_len} if seq_len else {}))
    elif seq_len:
        raise ValueError("a stage's `seq_len` applies to text data, not to a task (which sets its own)")
    optimizer = cfg.optimizer.model_copy(update={"lr": lr}) if lr else cfg.optimizer
    return TrainConfig(
        model=ModelSection(file=program, backend=cfg.student.backend),
        data=data,
        training=TrainingSection(**training),
        optimizer=optimizer,
        scheduler=cfg.scheduler,
        checkpoint=cfg.checkpoint,
        metrics=cfg.metrics,
    )


def _train(
    cfg, stage, k: int, folder: Path, teacher: Loaded, current: Current, resume, on_step
) -> StageResult:
    tcfg = train_config(cfg, current.program, folder, stage.steps, stage.lr, stage.batch_size, stage.seq_len)
    weights = read_weights(current.weights, "student.weights") if current.weights is not None else None
    terms = (
        KdTerms(stage.kl_weight, stage.ce_weight, stage.temperature) if hasattr(stage, "kl_weight") else None
    )
    objective = StageObjective(stage.kind, teacher.model, stage.train, weights, terms)
    start = heldout_start(tcfg, objective)
    train_run(tcfg, resume=resume, on_step=on_step, objective=objective)
    return _finish(k, stage.kind, folder, current.program.read_text(), objective.model, start=start)


def heldout_start(tcfg: TrainConfig, objective: StageObjective) -> float | None:
    """The stage's held-out loss before its first step (None without a held-out split): the
    student as the trainer starts it (same seed, same `prepare`) on the rows the trainer evaluates
    at the end, so the two figures compare the stage's own objective on the same tokens."""
    t = tcfg.training
    torch.manual_seed(t.seed)
    model = build_model(tcfg)
    val = validation(tcfg, model.config.vocab)
    if val is None:
        return None
    objective.prepare(model)
    device = init_dist(t.device).device
    dtype = torch.bfloat16 if t.precision == "bf16" else torch.float32
    fwd = objective.loss_module(TrainModel(model.to(device)), t.loss_chunk, dtype)
    bf16 = t.precision == "bf16"
    return objective_loss(fwd, val.eval_batches(tcfg.metrics.eval_rows), device, bf16)


def _select(cfg, stage, k: int, folder: Path, teacher: Loaded, current: Current) -> StageResult:
    """Rank the replaced layers, keep the chosen ones as the teacher's attention (`select.py`)."""
    from lt2dsl.frontend import load_or_raise
    from lt2dsl.ir.printer import print_program

    student = build(current.program, cfg.student.backend, str(current.program))
    if current.weights is None:
        init_student(teacher.model, student)
    else:
        load_into(student, read_weights(current.weights, "student.weights"), "the student's weights")
    pairs = line_up(teacher.model.ir, student.ir)
    vocab = student.config.vocab
    batches = heldout_batches(train_config(cfg, current.program, folder), stage.rows, vocab)
    device = init_dist(cfg.training.device).device
    t, s = frozen_teacher(teacher.model, device), TrainModel(student.to(device))
    scores = select.rank_layers(t, s, pairs, batches)
    chosen = select.choose(scores, stage.keep, stage.method, stage.seed)
    program = select.hybrid_program(load_or_raise(current.program).program, pairs, chosen, student.ir.config)
    hybrid_text = print_program(program)
    hybrid = build(hybrid_text, cfg.student.backend, "the hybrid student")
    state = select.hybrid_state(hybrid, _cpu(student.state_dict()), _cpu(teacher.model.state_dict()), chosen)
    hybrid.load_state_dict(state, strict=True)
    selection = {
        "method": stage.method,
        "keep": stage.keep,
        "scores": {pairs[i].student.id: v for i, v in scores.items()},
        "chosen": [pairs[i].student.id for i in chosen],
    }
    return _finish(k, "select", folder, hybrid_text, hybrid, selection)


def _cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in state.items()}


def _finish(
    k: int,
    kind: str,
    folder: Path,
    text: str,
    model,
    selection: dict | None = None,
    start: float | None = None,
) -> StageResult:
    """Write the student as it leaves the stage, then `done.json` (last: it marks the stage done);
    `start` is the held-out loss before the first step (`evals[0]`)."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / PROGRAM, text)
    save_weights(model, folder / WEIGHTS)
    losses, evals = _metrics(folder)
    if start is not None:
        evals = {0: start} | evals
    result = StageResult(k, kind, folder, folder / PROGRAM, folder / WEIGHTS, losses, evals, selection)
    done = {"kind": kind, "losses": losses, "evals": evals, "selection": selection}
    atomic_write(folder / DONE, json.dumps(done, indent=1))
    return result


def save_weights(model, path: Path) -> None:
    """`model`'s state (CPU, contiguous) as safetensors, written atomically."""
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp))
    os.replace(tmp, path)


def _metrics(folder: Path) -> tuple[dict[int, float], dict[int, float]]:
    """Loss and held-out loss by step from the stage's `metrics.jsonl` (the last row of a step
    wins: a resumed run logs again the steps after its checkpoint)."""
    if not (folder / "metrics.jsonl").is_file():
        return {}, {}
    rows = read_metrics(folder)
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    evals = {r["step"]: r["eval/loss"] for r in rows if "eval/loss" in r}
    return losses, evals


def _read_done(folder: Path, k: int) -> StageResult | None:
    path = folder / DONE
    if not path.is_file():
        return None
    done = json.loads(path.read_text())
    losses = {int(s): v for s, v in done["losses"].items()}
    evals = {int(s): v for s, v in done["evals"].items()}
    return StageResult(
        k, done["kind"], folder, folder / PROGRAM, folder / WEIGHTS, losses, evals, done["selection"]
    )


# ---- the baseline -------------------------------------------------------------------------------


class _Kept(LMObjective):
    """The LM objective over a random start, keeping the model to save it afterwards."""

    model = None

    def prepare(self, model) -> None:
        self.model = model


def budget_steps(cfg: DistillConfig) -> int:
    """Steps at the run's batch and row length holding as many tokens as the training stages."""
    base_rows = cfg.training.batch_size
    base_len = cfg.data.seq_len if isinstance(cfg.data, DataConfig) else 1
    tokens = sum(
        s.steps * (s.batch_size or base_rows) * (s.seq_len or base_len)
        if isinstance(cfg.data, DataConfig)
        else s.steps * (s.batch_size or base_rows)
        for s in cfg.stages
        if s.kind != "select"
    )
    return max(1, math.ceil(tokens / (base_rows * base_len)))


def _baseline(cfg: DistillConfig, out: Path, current: Current, resume: bool) -> StageResult:
    """A randomly initialised student of the final program, trained with the LM loss on as many
    tokens as the distillation's training stages (`<out>/baseline/`)."""
    folder = out / "baseline"
    done = _read_done(folder, 0) if resume else None
    if done is not None:
        return done
    objective = _Kept()
    train_run(
        train_config(cfg, current.program, folder, budget_steps(cfg)), resume=resume, objective=objective
    )
    return _finish(0, "baseline", folder, current.program.read_text(), objective.model)
