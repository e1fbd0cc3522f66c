"""The estimate's training activations (`cost.estimate.block_activations`) against what autograd
really saves for backward in the lowered bf16 module (saved-tensor hooks, `train/saved.py`; the
Triton kernels interpreted on the CPU), per token and block application: every mixer kind, the
MLPs and the norm forms, within 2% (all but `dsa` agree to the byte)."""

from __future__ import annotations

import pytest
import torch

import lt2dsl
from lt2dsl.cost.estimate import block_activations
from lt2dsl.ir.registry import lookup
from lt2dsl.ir.specs.common import CAT_ALIGN
from lt2dsl.kernels import fused
from lt2dsl.lowering import resolve_source
from lt2dsl.passes.resolve import blocks
from lt2dsl.train.saved import per_token_application, saved_bytes

MODEL = """model m {{{{
  dim = 32
  vocab = 64
  heads = 2
  head_dim = 16
  max_len = 256
  tie_embeddings = true
  mlp = {mlp}
  norm = {norm}
  {mixer} * {{n}}
}}}}
"""
NONE, RMS = "none", "rmsnorm"
# id: (mixer, mlp, norm); tiny shapes, one of each kind and of the options that change what is kept.
# Lengths 16 and 32 tokens, and 64 and 128 for the delta rule, whose chunk op keeps a state per
# 64-token chunk; the other chunk ops keep per-token tensors only.
CASES = {
    "deltanet": ("deltanet(gate=true)", NONE, RMS),
    "gdn": ("gdn(v_heads=4, expand_v=2)", NONE, RMS),
    "kda": ("kda(expand_v=2)", NONE, RMS),
    "gla": ("gla(kv_heads=1)", NONE, RMS),
    "retnet": ("retnet", NONE, RMS),
    "mamba2": ("mamba2(state=16, expand=2, head_dim=16, groups=2)", NONE, RMS),
    "mlstm": ("mlstm", NONE, RMS),
    "linear": ("linear", NONE, RMS),
    "linear_hedgehog": ("linear(feature_map=hedgehog, normalize=false)", NONE, RMS),
    "full": ("full(kv_heads=1, gate=sdpa)", NONE, RMS),
    "swa": ("swa(window=8, gate=headwise)", NONE, RMS),
    "dsa": ("dsa(topk=8, index_heads=2, index_dim=8)", NONE, RMS),
    "nsa": ("nsa(block=8, select=2, window=8, cmp_block=8, stride=4)", NONE, RMS),
    "tmm": ("tmm(heads=2)", NONE, RMS),
    "swiglu": ("full", "swiglu(hidden=72)", RMS),
    "geglu": ("full", "geglu(hidden=64)", "layernorm"),
    "gelu": ("full", "gelu(hidden=64)", "rmsnorm(offset=true)"),
    "sandwich_qk_norm": ("full(qk_norm=true)", "swiglu(hidden=64)", "sandwich"),
}


def cpu_composite_surplus(mixer: str, norm: str) -> int:
    """Elements per token a standalone `nn.RMSNorm` keeps on the CPU beyond what the estimate
    counts (CUDA's fused `rms_norm`: the input and fp32 rstd): the composite keeps the fp32 input
    and fp32 normed value instead, 3 more elements per channel. The standalone ones here: a
    sandwich block's two branch norms (D channels each) and `qk_norm`'s q and k norms."""
    surplus = 0
    if norm == "sandwich":
        surplus += 3 * 2 * 32
    if "qk_norm=true" in mixer:
        surplus += 3 * (2 * 16 + 2 * 16)
    return surplus


def measured(src: str, lengths: tuple[int, int]) -> float:
    """Saved bytes per token per block application of the lowered bf16 module."""

    def saved(n: int, T: int) -> int:
        torch.manual_seed(0)
        model = lt2dsl.compile(src.format(n=n), backend="triton", dtype=torch.bfloat16)
        ids = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(1))
        return saved_bytes(lambda: model(ids))

    return per_token_application(saved, lengths=lengths)


@pytest.mark.parametrize("case", list(CASES))
def test_estimated_activations_are_what_autograd_saves(case):
    mixer, mlp, norm = CASES[case]
    src = MODEL.format(mixer=mixer, mlp=mlp, norm=norm)
    ir = resolve_source(src.format(n=1), {})
    block = blocks(ir.body)[0][0]
    estimate = 2 * (block_activations(block, ir.config) + cpu_composite_surplus(mixer, norm))
    got = measured(src, (64, 128) if lookup(block.mixers[0].type).is_delta_rule() else (16, 32))
    print(f"{case}: estimate {estimate}, measured {got:.0f} bytes per token and application")
    assert abs(estimate - got) <= 0.02 * got


def test_cat_align_is_the_kernels():
    assert CAT_ALIGN == fused.CAT_ALIGN
