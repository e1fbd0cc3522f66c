"""GDN: reference forms (CPU, float64) and the Triton kernels (interpreter on CPU, full size on GPU)."""

from __future__ import annotations

import pytest

from tests.kernels.test_delta_family import OPS, chunk_ref, make_inputs
from tests.kernels.utils import assert_close

INFO = OPS["gated_delta_rule"]


@pytest.mark.parametrize("T", [63, 100])
def test_reference_strong_decay(T):
    """Log decays down to ≈ −60 per step: Γ must come from exp(b_r − b_i), never from e^{−b_i}."""
    x = make_inputs("scalar", B=1, T=T, H=1, HV=2, K=16, V=8, decay=30.0, seed=7)
    o, S = INFO.call_naive(x, initial_state=x["initial_state"], output_final_state=True)
    o2, S2 = chunk_ref(INFO, x, initial_state=x["initial_state"], output_final_state=True)
    assert_close("o", o2, o, 1e-10)
    assert_close("S", S2, S, 1e-10)
