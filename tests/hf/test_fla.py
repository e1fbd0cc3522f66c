"""Import parity for the peer's (fla) families: GatedDeltaNet (with hybrid attention), DeltaNet, KDA
and GLA. fla's Triton kernels and its flash-attn layers do not run on the CPU, so each checkpoint
is laid out by hand from fla's config fields and weight names (`fla/models/*/configuration_*.py`,
`fla/layers/*.py`) with random weights, and compared against `bench/hf_reference.py`'s `fla_logits`, an
independent step-by-step forward of fla's modules (no lt2dsl code): logits within 1e-5
relative and greedy tokens equal."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("safetensors")

from bench.hf_layouts import FLA_CASES, fla_checkpoint
from bench.hf_reference import fla_logits
from lt2dsl.hf import from_pretrained

from .util import greedy, prompt, rel_err


@pytest.mark.parametrize("kind", list(FLA_CASES))
def test_fla_family_matches_reference(kind, tmp_path):
    cfg, state = fla_checkpoint(kind, tmp_path)
    ours = from_pretrained(tmp_path, dtype=torch.float32, backend="reference").eval()
    ids = prompt()

    def ref(x):
        return fla_logits(state, cfg, x, kind)

    with torch.no_grad():
        assert rel_err(ours(ids), ref(ids)) < 1e-5
        assert torch.equal(ours.generate(ids, 3), greedy(ref, ids, 3))
