"""FLOP formulas: exact causal triangle, decode ∝ L, training convention, loops × T."""

import pytest

from lt2dsl.cost.estimate import EstimateOptions, estimate
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import REGISTRY, lookup
from lt2dsl.passes.resolve import blocks
from tests.cost.helpers import call, loop, model


def mixer_of(m):
    return blocks(m.body)[0][0].mixers[0]


def test_full_attention_core_is_the_exact_triangle():
    m = model([call("full", heads=4, head_dim=32)], dim=128)
    mx = mixer_of(m)
    f = lookup("full").flops(mx.opts, m.config, 100, "prefill")
    # 4·d per visible key per head; keys per query average (L + 1)/2 = 50.5.
    assert f.core == 4 * 32 * 50.5 * 4
    sq = lookup("full").flops(mx.opts, m.config, 100, "prefill", causal="full")
    assert sq.core == 4 * 32 * 100 * 4
    # projections: q, k, v, o each 128·128, 2 FLOPs per weight.
    assert f.proj == 2 * 4 * 128 * 128


def test_decode_attention_is_linear_in_L_and_recurrent_is_flat():
    m = model([call("full"), call("gdn")], dim=128)
    d1 = estimate(m, EstimateOptions(seq=1000)).flops_per_token.decode
    d2 = estimate(m, EstimateOptions(seq=2000)).flops_per_token.decode
    attn_per_key = 4 * 128  # 4·d·H with H·d = 128
    assert d2 - d1 == pytest.approx(attn_per_key * 1000)


def test_swa_counts_at_most_the_window():
    m = model([call("swa", window=16, heads=2, head_dim=8)], dim=16)
    mx = mixer_of(m)
    f = lookup("swa").flops(mx.opts, m.config, 1000, "prefill")
    keys = (16 * 17 / 2 + (1000 - 16) * 16) / 1000
    assert f.core == pytest.approx(4 * 8 * keys * 2)
    assert lookup("swa").flops(mx.opts, m.config, 1000, "decode").core == 4 * 8 * 16 * 2


def test_training_is_three_forwards_and_loops_multiply():
    m = model([loop(3, call("gdn"), call("full"))], dim=128)
    r = estimate(m, EstimateOptions(seq=512))
    assert r.flops_per_token.train == pytest.approx(3 * r.flops_per_token.prefill)
    one = estimate(model([call("gdn"), call("full")], dim=128), EstimateOptions(seq=512))
    head = 2 * 128 * 32000
    assert r.flops_per_token.prefill - head == pytest.approx(3 * (one.flops_per_token.prefill - head))


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_every_kind_has_positive_finite_figures(kind):
    extra = {"max_len": 4096} if kind == "tmm" else {}
    m = model([call(kind, **extra)], dim=256, max_len=4096)
    r = estimate(m, EstimateOptions(seq=1024))
    row = r.blocks[0]
    assert row.params_stored > 0
    assert 0 < row.flops_prefill < 1e12 and 0 < row.flops_decode < 1e12
    assert row.state_bytes + row.kv_bytes > 0


def test_gdn_core_formula():
    # per value head: 6CK + 4CV + C²/3 + 6KV with C = 64, K = 32, V = 64; decode 7KV.
    m = model([call("gdn", heads=2, head_dim=32, expand_v=2)], dim=64, mlp=n.NoneVal())
    mx = mixer_of(m)
    f = lookup("gdn").flops(mx.opts, m.config, 4096, "prefill")
    assert f.core == 2 * (6 * 64 * 32 + 4 * 64 * 64 + 64 * 64 / 3 + 6 * 32 * 64)
    assert lookup("gdn").flops(mx.opts, m.config, 4096, "decode").core == 2 * 7 * 32 * 64
