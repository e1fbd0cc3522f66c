"""Both caches' logits against one float64 forward (`util.assert_near_the_truth`), the check the GPU
tests make at full size: in bf16 on the Triton kernels the GPU runs (the CPU interpreter in CI),
and its refusal where the model's dtype cannot resolve a wrong step from rounding.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lt2dsl.kernels.delta import ops as delta_ops
from lt2dsl.kernels.delta import recipe as delta_recipe

from ..lowering.util import call, lower, tokens
from .util import Unresolvable, assert_near_the_truth, assert_near_the_truth_resolved, jitter


@pytest.mark.slow
@pytest.mark.parametrize("fused_scan", [False, True], ids=["split", "fused"])
def test_bf16_triton_cache_paths_are_as_near_the_truth_as_a_forward(monkeypatch, fused_scan):
    """bf16 on the Triton kernels, in both delta-rule forms (the H100 runs the split one for GDN at
    batch ≤ 2, the CPU's default is the fused one), prompts long enough for the chunked kernels:
    prefill and the recurrent and flash-decoding steps of both caches are as near the float64
    truth as the model's own bf16 forward."""
    default = delta_recipe.default_recipe

    def forms(*args):
        return replace(default(*args), fused_scan=fused_scan)

    monkeypatch.setattr(delta_recipe, "default_recipe", forms)
    monkeypatch.setattr(delta_ops, "RECURRENT_MAX_T", 2)  # prompts of 3+ tokens take the chunked kernels
    model = jitter(lower(f"loop T=2 < {call('gdn')}; {call('swa')} >", backend="triton", dtype=torch.float32))
    errs = assert_near_the_truth(model.bfloat16(), tokens(2, 12), 8)
    assert errs["forward"] > 0, errs  # bf16 rounding is there to compare against


def test_a_model_too_sensitive_for_its_dtype_is_checked_in_float32():
    """A random-init sandwich-norm GDN stack amplifies bf16 rounding until its forward is far from
    the truth: the bf16 check refuses it rather than pass any path, and the resolved check runs
    in float32 on the same weights."""
    body = "loop T=4, final_norm=true < gdn(expand_v=1) * 3 >"
    model = lower(body, dtype=torch.bfloat16, norm="sandwich", dim=64, head_dim=32)
    seq = tokens(1, 16)
    with pytest.raises(Unresolvable, match="cannot resolve"):
        assert_near_the_truth(model, seq, 12)
    errs = assert_near_the_truth_resolved(model, seq, 12)
    assert errs["dtype"] == "torch.float32" and model.embed.weight.dtype == torch.float32
