"""The language features imports need, on their own: estimate counts, partial RoPE, RoPE scaling
frequencies, the (1 + w) norm and the embedding scale."""

from __future__ import annotations

import math

import pytest
import torch

import lt2dsl
from lt2dsl.cost.estimate import model_weights
from lt2dsl.frontend import load_or_raise
from lt2dsl.lowering.rope_scaling import scale_inv_freq

BASE = (
    "model m {{\n  dim = 32\n  vocab = 64\n  heads = 4\n  head_dim = 8\n  kv_heads = 2\n"
    "  dtype = fp32\n  {body}\n}}\n"
)


def weights(body: str) -> dict:
    return model_weights(load_or_raise(BASE.format(body=body)).model)


def test_qkv_bias_adds_q_k_v_biases_only():
    plain, qkv, all_ = weights("full"), weights("full(qkv_bias=true)"), weights("full(bias=true)")
    added = set(qkv) - set(plain)
    assert added == {f"blocks.0.mixers.0.{p}_proj.bias" for p in "qkv"}
    assert sum(math.prod(qkv[k]) for k in added) == 4 * 8 + 2 * 2 * 8  # H·d + 2·HKV·d
    assert set(all_) - set(qkv) == {"blocks.0.mixers.0.o_proj.bias"}


def test_geglu_and_offset_norm_count_as_swiglu_and_rmsnorm():
    assert weights("full(mlp=geglu(hidden=48))") == weights("full(mlp=swiglu(hidden=48))")
    with_offset = BASE.format(body="full").replace("dtype = fp32", "norm = rmsnorm(eps=1e-5, offset=true)")
    assert model_weights(load_or_raise(with_offset).model) == weights("full")


def test_partial_rope_rotates_the_leading_dims_only():
    torch.manual_seed(0)
    part = lt2dsl.compile(BASE.format(body="full(rope_dim=4)"), backend="reference").eval()
    mixer = part.blocks[0].mixers[0]
    x = torch.randn(1, 5, 2, 8)
    y = mixer.rope(x, 3)
    assert torch.equal(y[..., 4:], x[..., 4:])
    # the leading 4 dims rotate as a 4-dim head would, at positions 3..7
    d = 4
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(3, 8).float()[:, None] * inv
    x1, x2 = x[..., :2], x[..., 2:4]
    c, s = ang.cos()[None, :, None], ang.sin()[None, :, None]
    expected = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    assert torch.allclose(y[..., :4], expected, atol=1e-6)


def test_llama3_scaling_keeps_high_divides_low_and_blends_between():
    inv = torch.tensor([1.0, 0.3, 0.05, 0.001])  # wavelengths 6.3, 21, 126, 6283
    out = scale_inv_freq(inv, ("llama3", 8.0, 1.0, 4.0, 64))  # bands: < 16 keep, > 64 divide
    assert out[0] == inv[0] and out[3] == inv[3] / 8
    s = (64 / (2 * math.pi / 0.3) - 1) / 3
    assert math.isclose(float(out[1]), (1 - s) * 0.3 / 8 + s * 0.3, rel_tol=1e-6)
    assert torch.equal(scale_inv_freq(inv, ("linear", 4.0)), inv / 4)


def test_offset_norm_and_embedding_scale():
    settings = "norm = rmsnorm(eps=1e-6, offset=true)\n  tie_embeddings = false\n  embed_scale = true"
    src = BASE.format(body="full").replace("dtype = fp32", settings)
    torch.manual_seed(0)
    model = lt2dsl.compile(src, backend="reference", dtype="fp32").eval()
    assert torch.count_nonzero(model.final_norm.weight) == 0  # (1 + 0): the identity scale at init
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        model.final_norm.weight.fill_(0.5)
        expected = 1.5 * torch.nn.functional.rms_norm(x, (32,), eps=1e-6)
        assert torch.allclose(model.final_norm(x), expected, atol=1e-6)
        # embed_scale = true is the unscaled model with its embedding table × sqrt(dim)
        plain = lt2dsl.compile(src.replace("  embed_scale = true\n", ""), backend="reference", dtype="fp32")
        state = model.state_dict()
        plain.load_state_dict(state | {"embed.weight": state["embed.weight"] * math.sqrt(32)})
        ids = torch.tensor([[1, 2, 3, 4]])
        assert torch.allclose(model(ids), plain(ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body", ["full(rope_dim=6)", "swa(window=4, rope_dim=8)"])
def test_valid_rope_dims_compile(body):
    lt2dsl.compile(BASE.format(body=body), backend="reference", device="meta")
