"""`TrainConfig`: one run, composed of each component's own config (torchtitan's layout).

A run is a TOML file in flame's sections (`[model]`, `[data]`, `[training]`, `[optimizer]`,
`[scheduler]`, `[checkpoint]`, `[parallel]`, `[metrics]`) or a Python function returning a
`TrainConfig`. Each section's model lives beside the code that builds from it (`DataConfig` in
`data.py`, `OptimConfig` in `optim.py`, ...); this file composes them and adds the two that the
loop itself reads (`ModelSection`, `TrainingSection`). Every model forbids unknown keys, so a typo
is an error naming the field.

    [model]
    file = "examples/lt2_hybrid_gdn_dsa.lt2"
    set = { dim = 512, "loop.T" = 2 }

    [data]
    train = ["corpus/train.jsonl"]
    seq_len = 2048

    [training]
    steps = 1000
    batch_size = 32
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from lt2dsl.train.checkpoint import CheckpointConfig
from lt2dsl.train.data import DataConfig, TaskDataConfig
from lt2dsl.train.metrics import MetricsConfig
from lt2dsl.train.optim import OptimConfig, SchedulerConfig
from lt2dsl.train.parallel import ParallelConfig

STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ModelSection(BaseModel):
    """Which model to train."""

    model_config = STRICT

    file: Path
    """The `.lt2` program (relative paths are read from the config file's folder)."""
    set: dict[str, Any] = Field(default_factory=dict)
    """Setting overrides, as `lt2dsl compile --set` takes them (`dim = 512`, `"loop.T" = 2`)."""
    backend: Literal["auto", "reference", "triton"] = "auto"
    """Kernel backend of every mixer: Triton where a kernel exists for the device, else PyTorch."""
    fuse: bool = True
    """Run every block through the lowering's fusion passes (`lt2dsl.compile`'s fused ops), one
    graph per block so FSDP2 and activation checkpointing still wrap each application; false runs
    the blocks' modules eagerly, as written (what a forward hook on a mixer needs)."""
    freeze: list[str] = Field(default_factory=list)
    """Parameter-name globs (`LT2Model` names, e.g. `blocks.*.mixers.*.w`) kept at their initial
    values: no gradient, no optimizer state. A glob that matches nothing is an error."""


class TrainingSection(BaseModel):
    """The loop: steps, batch, numerics, memory and speed switches."""

    model_config = STRICT

    steps: int = Field(gt=0)
    """Optimizer steps of the whole run (the schedule's length; resuming does not change it)."""
    batch_size: int = Field(default=8, gt=0)
    """Global batch in rows (sequences of `data.seq_len` tokens) per optimizer step, all processes."""
    grad_accum: int = Field(default=1, gt=0)
    """Micro-batches per step: each process runs batch_size / (grad_accum · world) rows at a time."""
    seed: int = Field(default=0, ge=0, lt=2**31)
    """Seeds the initialisation and the data order; the same seed gives the same run."""
    precision: Literal["bf16", "fp32"] = "bf16"
    """bf16: the forward on bf16 copies of the weights (FSDP's param dtype; the trainer's own
    casts for one process and DDP), with fp32 master weights, gradients and optimizer state.
    fp32: everything in fp32 (CPU tests, exact comparisons)."""
    activation_checkpoint: Literal["none", "per_application"] = "none"
    """`per_application`: keep only each block application's input (and what `checkpoint_keep`
    names) and recompute the rest in backward (a looped block is checkpointed once per iteration)."""
    checkpoint_keep: list[Literal["attention"]] = Field(default_factory=lambda: ["attention"])
    """Under `per_application`, op outputs kept from the forward rather than recomputed:
    `attention`, the softmax and sparse attention forwards' o and log-sum-exp (H·(d·b + 4) bytes a
    token and op; the estimate's training memory counts them). Their recompute was a quarter of the
    looped GDN+DSA hybrid's checkpointed step at 8k (BENCHMARKS.md). `[]` recomputes everything."""
    compile: bool = False
    """`torch.compile` every block's forward (after checkpointing, before sharding): one graph per
    block for unpacked rows (a graph break is an error), breaks allowed for packed rows."""
    compile_backend: Literal["inductor", "eager"] = "inductor"
    """torch.compile's backend: `inductor` generates kernels; `eager` traces the same graphs and
    runs them as they are (checks for graph breaks in seconds, without code generation)."""
    cuda_graph: bool = False
    """Capture each step (forward, backward, clipping, AdamW) as one CUDA graph per shape of its
    micro-batches and replay it: for small models whose steps are bound by kernel launches. The
    first steps of each shape run eagerly (Triton autotuning, optimizer state), then the step is
    captured; the losses are the eager run's within bf16 noise. One process, no `compile`, no
    activation checkpointing, `data.pack_documents = false`, the LM objective (not
    distillation's); each else a ValueError. A `dsa` model's indexer loss is captured with the
    step. On the CPU nothing is captured: the steps run eagerly through the same static buffers,
    the run without it bit for bit (docs/train.md, "CUDA graphs")."""
    loss_chunk: int = Field(default=4096, gt=0)
    """Tokens per cross-entropy chunk: logits of at most this many tokens exist at a time."""
    indexer_loss: float = Field(default=1.0, ge=0)
    """Weight of the `dsa` lightning indexer's KL loss (mixers.md §11(b)), the only thing that
    trains the indexer (its top-k pick passes no gradient): per `dsa` application the mean over
    tokens of KL(main attention ‖ softmax(index scores)), the main attention a fixed target.
    0 freezes the indexers. Models without `dsa` ignore it."""
    indexer_loss_keys: Literal["selected", "all"] = "selected"
    """`selected`: both distributions over the indexer's top-k keys (DeepSeek-V3.2's sparse
    stage); `all`: over every causal key (its dense warm-up)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto`: the process's CUDA device when there is one, else the CPU."""
    out: Path = Path("runs/train")
    """Run folder: checkpoints, metrics JSONL, plot (relative to the config file's folder)."""


def _data_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "task" if "task" in value else "files"
    return "task" if isinstance(value, TaskDataConfig) else "files"


AnyData = Annotated[
    Annotated[DataConfig, Tag("files")] | Annotated[TaskDataConfig, Tag("task")],
    Discriminator(_data_kind),
]


class TrainConfig(BaseModel):
    """A whole run (see the module docstring)."""

    model_config = STRICT

    model: ModelSection
    data: AnyData
    training: TrainingSection
    optimizer: OptimConfig = Field(default_factory=OptimConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a TOML (or, with PyYAML installed, YAML) run file; relative paths in it are taken
    from the file's folder. `overrides` are dotted keys (`training.steps`) applied on top.

    Raises:
        ValueError: the file cannot be read or parsed, or a field is wrong (named in the message).
    """
    path = Path(path)
    raw = _read(path)
    for key, value in (overrides or {}).items():
        _set_dotted(raw, key, value)
    cfg = validate(raw, str(path))
    return rebase(cfg, path.parent)


def validate(raw: dict[str, Any], where: str = "config") -> TrainConfig:
    """`TrainConfig` of a dict; ValueError listing each bad field as `section.key: problem`."""
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as e:
        raise ValueError(f"{where}: " + "; ".join(_field_errors(e))) from None


def _field_errors(e: ValidationError) -> list[str]:
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"] if p not in ("files", "task"))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        out.append(f"`{loc}`: {msg}")
    return out


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"cannot read `{path}`: {'not a file' if path.exists() else 'no such file'}")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        return _read_yaml(text, path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None


def _read_yaml(text: str, path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ModuleNotFoundError:
        raise ValueError(f"{path}: reading YAML needs PyYAML (`pip install pyyaml`); or use TOML") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of sections at the top level")
    return raw


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = raw
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot override `{key}`: `{p}` is not a section")
    node[last] = value


def rebase(cfg: TrainConfig, root: Path) -> TrainConfig:
    """Paths in the config taken relative to `root` (the config file's folder)."""

    def at(p: Path | None) -> Path | None:
        return p if p is None or p.is_absolute() else root / p

    model = cfg.model.model_copy(update={"file": at(cfg.model.file)})
    training = cfg.training.model_copy(update={"out": at(cfg.training.out)})
    data = cfg.data.rebase(root)
    return cfg.model_copy(update={"model": model, "training": training, "data": data})
