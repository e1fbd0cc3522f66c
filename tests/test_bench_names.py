"""`python bench/X.py` puts bench/ first on the import path: a bench module named like an installed
package shadows that package for every bench script (a `bench/kernels.py` hid the `kernels`
package that transformers imports, and the peers' decode benchmarks skipped themselves)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench"
# imported by the bench scripts directly or through transformers and fla, installed or not here
IMPORTED = {"kernels", "transformers", "fla", "triton", "torch", "safetensors", "tokenizers", "einops"}


def _installed_elsewhere(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return False
    return BENCH.resolve() not in Path(spec.origin).resolve().parents


def test_no_bench_module_is_named_like_a_package():
    stems = {p.stem for p in BENCH.glob("*.py")} | {p.name for p in BENCH.iterdir() if p.is_dir()}
    clashes = sorted(s for s in stems if s in IMPORTED or _installed_elsewhere(s))
    assert clashes == [], f"bench modules shadowing packages: {clashes}"
