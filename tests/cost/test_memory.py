"""Decode memory as the research describes it, and exact cache bytes for single blocks."""

import pytest

from lt2dsl.cost.estimate import EstimateOptions, estimate
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup
from lt2dsl.ir.specs.common import causal_mean
from lt2dsl.passes.baseline import to_baseline
from tests.cost.helpers import call, loop, model


def kv_at(m, L, batch=1):
    r = estimate(m, EstimateOptions(seq=L, batch=batch))
    return r.memory.state_bytes, r.memory.kv_bytes


def test_looped_full_attention_cache_grows_with_L_and_T():
    T2 = model([loop(2, call("full"), call("full"))], dim=256, max_len=4096)
    T4 = model([loop(4, call("full"), call("full"))], dim=256, max_len=4096)
    _, kv_4k = kv_at(T2, 4096)
    _, kv_8k = kv_at(T2, 8192)
    _, kv_4k_T4 = kv_at(T4, 4096)
    assert kv_8k == 2 * kv_4k
    assert kv_4k_T4 == 2 * kv_4k


def test_looped_gdn_cache_is_constant_in_L():
    m = model([loop(4, call("gdn"), call("gdn"))], dim=256)
    assert kv_at(m, 4096) == kv_at(m, 32768)
    state, kv = kv_at(m, 4096)
    assert kv == 0 and state > 0


def test_baseline_ratio_shows_the_saving():
    m = model([loop(4, call("gdn"), call("gdn"), call("gdn"), call("full"))], dim=256)
    o = EstimateOptions(seq=32768)
    lt2, base = estimate(m, o), estimate(to_baseline(m), o)
    assert base.memory.cache_bytes > 3 * lt2.memory.cache_bytes
    assert base.params.stored < lt2.params.stored  # gdn blocks carry more weights than attention


def test_full_block_kv_bytes_by_hand():
    # batch 2, L = 100, 2 kv heads of 64 dims, bf16: k and v 2·2·100·64·2 bytes each.
    m = model([call("full", heads=4, kv_heads=2, head_dim=64)], dim=256)
    assert kv_at(m, 100, batch=2) == (0, 2 * (2 * 2 * 100 * 64 * 2))


def test_swa_ring_buffer_caps_at_the_window():
    m = model([call("swa", window=64, heads=4, kv_heads=4, head_dim=64)], dim=256)
    assert kv_at(m, 1000) == kv_at(m, 64) != kv_at(m, 32)


def test_gdn_state_and_conv_bytes_by_hand():
    # H = HV = 4, K = 64, V = 128: fp32 state 4·64·128·4 = 131,072 bytes; bf16 conv buffers
    # (W−1)·(2HK + HV·V)·2 = 3·(512 + 512)·2 = 6,144 bytes.
    m = model([call("gdn", heads=4, head_dim=64, expand_v=2)], dim=256)
    assert kv_at(m, 77) == (131_072 + 6_144, 0)


def test_tmm_caches_its_inputs_and_caps_max_len():
    m = model([call("tmm", heads=2, max_len=2048)], dim=64, max_len=2048)
    r = estimate(m, EstimateOptions(seq=1000))
    assert r.memory.kv_bytes == 1000 * 64 * 2
    assert r.capacity.max_len == 2048


def test_dsa_caches_index_keys():
    m = model([call("dsa", heads=4, kv_heads=4, head_dim=32, index_dim=16)], dim=128)
    _, kv = kv_at(m, 50)
    assert kv == 2 * (4 * 50 * 32 * 2) + 50 * 16 * 2


def test_state_bytes_scale_with_batch():
    m = model([call("mamba2")], dim=128)
    s1, _ = kv_at(m, 100, batch=1)
    s8, _ = kv_at(m, 100, batch=8)
    assert s8 == 8 * s1


def test_max_batch_and_len_fill_the_memory_exactly():
    m = model([loop(2, call("full"))], dim=512, vocab=1000)
    r = estimate(m, EstimateOptions(seq=4096, batch=3))
    free = 141e9 - r.memory.weights_bytes  # h200 preset
    per_seq = r.memory.cache_bytes / 3
    b = r.capacity.max_batch
    assert b * per_seq <= free < (b + 1) * per_seq
    L = r.capacity.max_len
    assert estimate(m, EstimateOptions(seq=L, batch=3)).memory.cache_bytes <= free
    assert estimate(m, EstimateOptions(seq=L + 1, batch=3)).memory.cache_bytes > free


def test_mlp_none_has_no_mlp_params():
    with_mlp = estimate(model([call("full")], dim=64))
    without = estimate(model([call("full")], dim=64, mlp=n.NoneVal()))
    assert with_mlp.params.stored - without.params.stored == 3 * 64 * 256 + 64


def test_generation_time_sums_the_decode_steps():
    from lt2dsl.cost.estimate import _step_time
    from lt2dsl.dtypes import Dtypes

    m = model([loop(2, call("full"), call("gdn"))], dim=256, vocab=1000)
    o = EstimateOptions(seq=1000, batch=4, gen=64)
    r = estimate(m, o)
    dt = Dtypes().resolve(m.config.dtype, m.config.state_dtype)
    brute = sum(_step_time(m, 1000 + i, o, dt) for i in range(1, 65))
    assert r.roofline.generate_s - r.roofline.ttft_s == pytest.approx(brute, rel=1e-6)
    flat = model([loop(2, call("gdn"))], dim=256, vocab=1000)
    rf = estimate(flat, o)
    assert rf.roofline.generate_s == pytest.approx(rf.roofline.ttft_s + 64 * rf.roofline.decode_step_s)
    assert estimate(m, EstimateOptions(seq=1000)).roofline.generate_s is None


def decode_bytes_per_step(m, L, batch=1):
    return estimate(m, EstimateOptions(seq=L, batch=batch)).roofline.decode_bytes_per_step


def test_dsa_decode_reads_index_keys_and_topk_kv_only():
    """Past top-k a DSA step's bytes grow by the index keys alone (d_I bf16 values per key and
    application); up to top-k it reads every cached tensor, as full attention does."""
    kw = dict(dim=256, vocab=64, max_len=65536)
    dsa = model([loop(2, call("dsa", topk=512, index_dim=32))], **kw)
    full = model([loop(2, call("full"))], **kw)
    grow = decode_bytes_per_step(dsa, 8192) - decode_bytes_per_step(dsa, 4096)
    assert grow == 2 * 4096 * 32 * 2
    assert decode_bytes_per_step(full, 8192) - decode_bytes_per_step(full, 4096) > 8 * grow
    spec, (o, cfg) = lookup("dsa"), mixer_of(dsa)
    for L, every in ((300, True), (512, True), (513, False)):
        read, cache = spec.decode_read(o, cfg, 2, L), spec.cache(o, cfg, 2, L)
        assert (read == cache) == every and read["k_idx"] == cache["k_idx"]
        assert read["k"].shape[2] == min(L, 512)


def test_nsa_decode_reads_compressed_selected_and_window_kv():
    kw = dict(dim=256, vocab=64, max_len=65536)
    nsa = model([loop(1, call("nsa"))], **kw)
    a, b = decode_bytes_per_step(nsa, 16384), decode_bytes_per_step(nsa, 32768)
    full = model([loop(1, call("full"))], **kw)
    assert 0 < b - a < (decode_bytes_per_step(full, 32768) - decode_bytes_per_step(full, 16384)) / 4
    spec, (o, cfg) = lookup("nsa"), mixer_of(nsa)
    read, cache = spec.decode_read(o, cfg, 1, 32768), spec.cache(o, cfg, 1, 32768)
    assert read["k_cmp"] == cache["k_cmp"]
    assert read["k"].shape[2] == o["select"] * o["block"] + o["window"]


def mixer_of(m):
    """(resolved options, model config) of the first mixer of `m`."""
    block = m.body[0].body[0]
    return block.mixers[0].opts, m.config


def test_prefill_counts_the_kv_a_dsa_query_gathers():
    """A DSA query gathers its own top-k keys' k and v (no tile is shared), so a long DSA prefill
    is bound by those bytes: min(t, k) · HKV · 2d kv-dtype values per query and application. On
    the H100 the looped GDN+DSA hybrid prefilled 4,096 tokens in 0.40 s (BENCHMARKS.md), as these
    bytes say (0.375 s), not as its FLOPs do (0.054 s)."""
    kw = dict(dim=256, vocab=64, heads=4, head_dim=32, max_len=65536)
    dsa = model([loop(2, call("dsa", topk=64))], **kw)
    full = model([loop(2, call("full"))], **kw)
    spec, (o, cfg) = lookup("dsa"), mixer_of(dsa)
    for L in (16, 64, 1000):
        assert spec.prefill_gather(o, cfg, L) == causal_mean(L, 64) * 4 * 2 * 32
    assert lookup("full").prefill_gather(*mixer_of(full), 1000) == 0
    r = estimate(dsa, EstimateOptions(seq=8192)).roofline
    gathered = 8192 * 2 * causal_mean(8192, 64) * 4 * 2 * 32 * 2  # tokens · apps · elements · bf16
    assert r.prefill_bound == "memory" and r.ttft_s >= gathered / EstimateOptions().hw.hbm_bytes_per_s
    f = estimate(full, EstimateOptions(seq=8192)).roofline
    assert f.prefill_bound == "compute"
