"""Tiny teachers and students for the distillation tests: byte-level Llama-style models over the
trainer's test corpus, and run-config dicts."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

import lt2dsl
from lt2dsl.distill.pipeline import save_weights

TEXT = Path(__file__).parents[1] / "train" / "data" / "public_domain.txt"

# GQA (2 query heads over 1 kv head) so that every student repeats the teacher's k/v heads.
HEAD = """model {name} {{
  dim = 32
  vocab = 256
  heads = 2
  head_dim = 16
  kv_heads = 1
  mlp = swiglu(hidden=64)
  {body}
}}
"""


def program(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.lt2"
    path.write_text(HEAD.format(name=name, body=body))
    return path


def compiled(source: str | Path, seed: int = 0):
    torch.manual_seed(seed)
    return lt2dsl.compile(source, backend="reference", dtype=torch.float32, fuse=False)


def random_teacher(folder: Path, body: str = "full * 4", seed: int = 0) -> tuple[Path, Path]:
    """A teacher program and random weights for it (`teacher.safetensors`)."""
    path = program(folder, "teacher", body)
    weights = folder / "teacher.safetensors"
    save_weights(compiled(path, seed), weights)
    return path, weights


def data(folder: Path, seq_len: int = 64) -> dict:
    return {
        "train": [str(TEXT)],
        "documents": "paragraph",
        "val_fraction": 0.1,
        "seq_len": seq_len,
        "cache": str(folder / "data"),
    }


def metrics() -> dict:
    return {"log_interval": 1, "eval_rows": 8, "progress": False, "plot": False}


def distill_config(folder: Path, teacher: tuple[Path, Path], student: Path, stages: list, **sections) -> dict:
    """A `DistillConfig` dict: fp32 on the CPU, 8 rows of 64 bytes, no checkpoints, no baseline;
    `sections` update the sections key by key."""
    cfg = {
        "teacher": {"file": str(teacher[0]), "weights": str(teacher[1]), "backend": "reference"},
        "student": {"file": str(student), "backend": "reference"},
        "data": data(folder),
        "training": {"batch_size": 8, "precision": "fp32", "out": str(folder / "run"), "seed": 0},
        "optimizer": {"lr": 3e-3, "weight_decay": 0.0},
        "scheduler": {"warmup_steps": 5},
        "checkpoint": {"enable": False},
        "metrics": metrics(),
        "stages": stages,
        "report": {"baseline": False, "eval_rows": 8, "export_hf": False, "plot": False},
    }
    cfg = copy.deepcopy(cfg)
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg
