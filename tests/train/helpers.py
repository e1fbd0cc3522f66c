"""Tiny runs for the trainer's tests: a looped GDN + DSA model over bytes, and config dicts."""

from __future__ import annotations

import copy
from pathlib import Path

TEXT = Path(__file__).parent / "data" / "public_domain.txt"

MODEL = """model tiny_gdn_dsa {{
  dim = 32
  vocab = 256
  heads = 2
  head_dim = 16
  mlp = swiglu(hidden=64)
  tie_embeddings = {tied}
  loop T=2 < gdn(expand_v=1); dsa(topk=8, index_heads=2, index_dim=8) >
}}
"""


def model_file(folder: Path, tied: bool = True, name: str = "model.lt2") -> Path:
    path = folder / name
    path.write_text(MODEL.format(tied=str(tied).lower()))
    return path


def config(folder: Path, out: str = "out", tied: bool = True, **sections) -> dict:
    """A config dict (sections as `TrainConfig` reads them); `sections` update them key by key."""
    cfg = {
        "model": {
            "file": str(model_file(folder, tied, f"model_{'tied' if tied else 'untied'}.lt2")),
            "backend": "reference",
        },
        "data": {
            "train": [str(TEXT)],
            "documents": "paragraph",
            "val_fraction": 0.1,
            "seq_len": 32,
            "cache": str(folder / "data"),
        },
        "training": {"steps": 6, "batch_size": 4, "precision": "fp32", "out": str(folder / out)},
        "optimizer": {"lr": 3e-3},
        "scheduler": {"warmup_steps": 2},
        "checkpoint": {"enable": False},
        "metrics": {"log_interval": 1, "eval_rows": 8, "progress": False, "plot": False},
    }
    cfg = copy.deepcopy(cfg)
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg
