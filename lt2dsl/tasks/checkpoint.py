"""A trained model from its `.lt2` file and a safetensors file of its `state_dict`.

The weights file is `model.safetensors` (or a folder holding one, such as a trainer's `step-N/`)
with `LT2Model.state_dict()` names; the trainer's own checkpoint reader will take over once it
exists, and this stays the plain path for a bare weights file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

WEIGHTS_NAME = "model.safetensors"


def weights_file(path: str | Path) -> Path:
    """The safetensors file of `path` (a file, or a folder holding `model.safetensors`).

    Raises:
        FileNotFoundError: neither exists.
    """
    p = Path(path)
    if p.is_dir():
        p = p / WEIGHTS_NAME
    if not p.is_file():
        raise FileNotFoundError(f"no weights at `{path}` (a .safetensors file or a folder holding one)")
    return p


def load_model(
    model_path: str | Path,
    weights: str | Path,
    *,
    overrides: dict[str, Any] | None = None,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    backend: str = "auto",
):
    """Compile `model_path` and load `weights` into it (strictly: every name, every shape).

    `dtype` defaults to the weights' floating dtype. Raises `DiagnosticError` for a bad program
    and ValueError naming the missing, unexpected or misshapen tensors for weights that do not fit.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    import lt2dsl

    try:
        state = load_file(str(weights_file(weights)), device="cpu")
    except SafetensorError as e:
        raise ValueError(f"`{weights}` is not a safetensors file: {e}") from None
    if dtype is None:
        dtype = next((t.dtype for t in state.values() if t.is_floating_point()), None)
    model = lt2dsl.compile(model_path, backend=backend, device=device, dtype=dtype, **(overrides or {}))
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    misshapen = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or misshapen:
        parts = [
            f"{what} {_few(names)}"
            for what, names in (("missing", missing), ("unexpected", unexpected), ("misshapen", misshapen))
            if names
        ]
        raise ValueError(f"the weights do not fit `{model_path}`: " + "; ".join(parts))
    model.load_state_dict(state)
    return model


def _few(names: list[str], k: int = 4) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:k])
    return shown + (f" and {len(names) - k} more" if len(names) > k else "")
