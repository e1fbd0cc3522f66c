"""Building a run's pieces from its config: the model, and the loaders of the training and held-out data."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

import torch

from lt2dsl.lowering.model import LT2Model
from lt2dsl.train.config import TrainConfig
from lt2dsl.train.data import DataConfig, TokenFile, has_split, prepare
from lt2dsl.train.loader import Shard, TaskLoader, TokenLoader


def build_model(cfg: TrainConfig) -> LT2Model:
    """The `.lt2` program with its overrides, in fp32 (the master weights), on the CPU.

    Built under the run's seed before anything else draws random numbers, so every process
    starts from the same weights.
    """
    from lt2dsl import compile as compile_lt2
    from lt2dsl.diagnostics import DiagnosticError

    if not cfg.model.file.is_file():
        raise ValueError(f"model.file: cannot read `{cfg.model.file}`")
    try:
        model = compile_lt2(
            cfg.model.file,
            backend=cfg.model.backend,
            dtype=torch.float32,
            fuse=cfg.model.fuse,
            **cfg.model.set,
        )
    except DiagnosticError as e:
        raise ValueError(f"model.file `{cfg.model.file}` has errors:\n{e}") from None
    if not model.config.head:
        raise ValueError("model: the program has `head = none`; training with the LM loss needs a head")
    freeze(model, cfg.model.freeze)
    return model


def freeze(model: torch.nn.Module, patterns: list[str]) -> list[str]:
    """Stop the gradient of every parameter whose name matches one of the glob `patterns`.

    Returns the frozen names; ValueError when a pattern matches nothing (a typo would silently
    leave the model trainable).
    """
    from fnmatch import fnmatchcase

    names = [n for n, _ in model.named_parameters()]
    frozen = set()
    for pat in patterns:
        hits = [n for n in names if fnmatchcase(n, pat)]
        if not hits:
            raise ValueError(f"model.freeze: {pat!r} matches no parameter of the model")
        frozen.update(hits)
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    return sorted(frozen)


def shard_of(cfg: TrainConfig, world: int, rank: int) -> Shard:
    t = cfg.training
    per = t.grad_accum * world
    if t.batch_size % per:
        raise ValueError(
            f"training.batch_size={t.batch_size} must be a multiple of grad_accum × processes "
            f"= {t.grad_accum} × {world}"
        )
    return Shard(micro=t.batch_size // per, accum=t.grad_accum, rank=rank, world=world)


@dataclass
class Data:
    """The training loader, the held-out loader (or None), and the row length."""

    train: TokenLoader | TaskLoader
    val: TokenLoader | TaskLoader | None
    seq_len: int


def build_data(cfg: TrainConfig, shard: Shard, vocab: int, main: bool, barrier) -> Data:
    if isinstance(cfg.data, DataConfig):
        return _files(cfg, cfg.data, shard, vocab, main, barrier)
    return _task(cfg, shard, vocab)


def _files(cfg: TrainConfig, dc: DataConfig, shard: Shard, vocab: int, main: bool, barrier) -> Data:
    cache = cfg.training.out / "data"
    if main:
        folder, n_vocab = prepare(dc, cache, progress=cfg.metrics.progress)
    barrier()
    if not main:
        folder, n_vocab = prepare(dc, cache, progress=False)
    if n_vocab > vocab:
        raise ValueError(
            f"the data's tokenizer has {n_vocab} tokens but the model's vocab is {vocab}: "
            f"set `model.set.vocab = {n_vocab}` (or more)"
        )
    seed = cfg.training.seed
    train = TokenLoader(TokenFile(folder, "train"), dc.seq_len, shard, seed, dc.pack_documents)
    val = None
    if has_split(folder, "val"):
        val = TokenLoader(TokenFile(folder, "val"), dc.seq_len, shard, seed, dc.pack_documents)
    return Data(train, val, dc.seq_len)


def _task(cfg: TrainConfig, shard: Shard, vocab: int) -> Data:
    try:
        tasks = import_module("lt2dsl.tasks")
    except ModuleNotFoundError as e:
        if e.name and "lt2dsl.tasks".startswith(e.name):
            raise ValueError("data.task needs `lt2dsl.tasks`, which is not part of this build") from None
        raise
    source = tasks.build(cfg.data.task_dict())
    loader = TaskLoader(source, shard, cfg.training.seed)
    ids, labels = loader._draw(0, "train")
    top = max(int(ids.max()), int(labels.max()))
    if top >= vocab or int(ids.min()) < 0:
        raise ValueError(
            f"data.task `{cfg.data.task}` uses token ids up to {top}, the model's vocab is {vocab}"
        )
    return Data(loader, loader, ids.shape[1])
