"""DeltaNet: reference forms (CPU, float64) and the Triton kernels (interpreter on CPU, full size on GPU)."""

from __future__ import annotations

import torch

from tests.kernels.test_delta_family import OPS, chunk_ref, make_inputs
from tests.kernels.utils import assert_close

INFO = OPS["delta_rule"]


def test_reference_reflections():
    """β up to 2 (allow_neg_eigval: I − 2kkᵀ is a reflection) with unit keys stays bounded and exact."""
    x = make_inputs("none", B=1, T=100, H=1, HV=2, K=16, V=8, seed=2)
    x["beta"] = x["beta"] * 2
    o, S = INFO.call_naive(x, initial_state=x["initial_state"], output_final_state=True)
    o2, S2 = chunk_ref(INFO, x, initial_state=x["initial_state"], output_final_state=True)
    assert torch.isfinite(o).all()
    assert_close("o", o2, o, 1e-10)
    assert_close("S", S2, S, 1e-10)
