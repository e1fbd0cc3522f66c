"""Hardware presets for the roofline (`--hw h200|h100|a100|b200|cpu|FILE.json`).

A preset is a JSON file: `peak_flops` per dtype (dense FLOP/s), `hbm_bytes_per_s`,
`memory_bytes`, plus `name`, `description` and `source`, and optionally `kernel_s`: the time one
kernel of a decode step's dependent chain costs beyond its bytes and FLOPs (launch, dispatch,
drain; measured by `bench/ceilings.py`; 0, not modelled, in the datasheet presets, which have no
such figure). User files use the same schema.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

HW_DIR = Path(__file__).parent / "hw"


class Hardware(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    peak_flops: dict[str, float]
    hbm_bytes_per_s: float
    memory_bytes: float
    kernel_s: float = Field(default=0.0, ge=0.0)
    source: str = ""

    def peak(self, dtype: str) -> float:
        return self.peak_flops.get(dtype, self.peak_flops["bf16"])

    def ridge(self, dtype: str) -> float:
        """Arithmetic intensity (FLOP/byte) above which work is compute-bound."""
        return self.peak(dtype) / self.hbm_bytes_per_s


def presets() -> list[str]:
    return sorted(p.stem for p in HW_DIR.glob("*.json"))


def load_hardware(name_or_path: str) -> Hardware:
    """A preset by name, or a user JSON file; ValueError with a readable message otherwise."""
    path = HW_DIR / f"{name_or_path}.json"
    if not path.exists():
        path = Path(name_or_path)
    if not path.exists():
        raise ValueError(
            f"unknown hardware `{name_or_path}`: use one of {', '.join(presets())} "
            "or a JSON file with the same keys"
        )
    try:
        return Hardware.model_validate(json.loads(path.read_text()))
    except (json.JSONDecodeError, ValidationError) as e:
        raise ValueError(f"bad hardware file {path}: {e}") from None
