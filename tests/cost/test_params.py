"""Parameter counts derived by hand from the published configurations."""

from lt2dsl.cost.estimate import block_params, estimate
from lt2dsl.ir import nodes as n
from lt2dsl.ir.registry import lookup
from lt2dsl.passes.resolve import blocks
from tests.cost.helpers import call, loop, model


def swiglu(hidden: int) -> n.Call:
    return n.Call(name="swiglu", args=(n.Arg(name="hidden", value=n.Int(value=hidden)),))


def llama_1b():
    return model(
        [n.Times(item=call("full", rope_theta=500000.0), n=16)],
        dim=2048,
        vocab=128256,
        heads=32,
        kv_heads=8,
        mlp=swiglu(8192),
        tie_embeddings=True,
    )


def test_llama_block_matches_hf_llama():
    # Llama-3.2-1B layer: q 2048·(32·64) = 4,194,304; k, v 2048·(8·64) = 1,048,576 each;
    # o 4,194,304; gate/up/down 3·2048·8192 = 50,331,648; two RMSNorms 2·2048 = 4,096.
    m = llama_1b()
    b, _ = blocks(m.body)[0]
    assert block_params(b, m.config) == 4_194_304 * 2 + 1_048_576 * 2 + 50_331_648 + 4_096 == 60_821_504


def test_llama_total_matches_published_count():
    # 16 layers + embedding 128256·2048 = 262,668,288 + final norm 2,048, head tied:
    # 1,235,814,400 — the count Hugging Face reports for Llama-3.2-1B.
    r = estimate(llama_1b())
    assert r.params.stored == 16 * 60_821_504 + 262_668_288 + 2_048 == 1_235_814_400
    assert r.params.executed == r.params.stored


def test_untied_head_adds_vocab_times_dim():
    tied = estimate(model([call("full")], dim=64, vocab=100, tie_embeddings=True))
    untied = estimate(model([call("full")], dim=64, vocab=100, tie_embeddings=False))
    assert untied.params.stored - tied.params.stored == 100 * 64


def test_gdn_matches_fla_gated_deltanet():
    # fla GatedDeltaNet(hidden_size=2048, head_dim=256, num_heads=6, expand_v=2, use_gate=True,
    # conv_size=4): q, k 2048·1536 = 3,145,728 each; v, g, o 2048·3072 = 6,291,456 each;
    # a, b 2048·6 = 12,288 each; convs (1536 + 1536 + 3072)·4 = 24,576 (no bias);
    # A_log 6, dt_bias 6; o_norm (FusedRMSNormGated over head_v_dim) 512.
    m = model([call("gdn", heads=6, head_dim=256, expand_v=2)], dim=2048, mlp=n.NoneVal())
    mixer = blocks(m.body)[0][0].mixers[0]
    expected = 2 * 3_145_728 + 3 * 6_291_456 + 2 * 12_288 + 24_576 + 6 + 6 + 512
    assert expected == 25_215_500
    assert lookup("gdn").params(mixer.opts, m.config) == expected


def test_gdn_grouped_value_heads_and_no_gate():
    # H = 2 q/k heads of 16, HV = 4 value heads of 32 (expand_v 2), no output gate, conv 4:
    # q, k 64·32 = 2,048 each; v 64·128 = 8,192; a, b 64·4 = 256 each; o 8,192;
    # convs (32 + 32 + 128)·4 = 768; A_log 4, dt_bias 4; o_norm 32.
    m = model([call("gdn", heads=2, head_dim=16, v_heads=4, gate=False)], dim=64, mlp=n.NoneVal())
    mixer = blocks(m.body)[0][0].mixers[0]
    assert lookup("gdn").params(mixer.opts, m.config) == 2 * 2_048 + 2 * 8_192 + 2 * 256 + 768 + 8 + 32


def test_loop_shares_weights_and_counts_executed():
    one = estimate(model([call("gdn"), call("swa")], dim=128))
    looped = estimate(model([loop(4, call("gdn"), call("swa"))], dim=128))
    assert looped.params.stored == one.params.stored
    blocks_only = one.params.stored - one.params.embedding - 128  # final norm
    assert looped.params.executed == one.params.stored + 3 * blocks_only


def test_final_norm_of_a_looped_final_norm_counts_every_iteration():
    # `loop T=4, final_norm=true < full >` runs the final norm after each of its 4 iterations and
    # not again after the loop: 4 applications of its 64 weights, stored once.
    plain = estimate(model([loop(4, call("full"))], dim=64, vocab=100))
    normed = estimate(model([loop(4, call("full"), final_norm=True)], dim=64, vocab=100))
    (head,) = [r for r in normed.extras if r.id == "head"]
    assert head.params_stored == 64 and head.params_executed == 4 * 64
    assert normed.params.stored == plain.params.stored
    assert normed.params.executed == plain.params.executed + 3 * 64
    # Not at the end of the body: 2 iterations, then once more after the last block; inside an
    # outer loop of 3: 3 × 2 applications, and the body ends with the outer loop (not normed).
    tail = estimate(model([loop(2, call("full"), final_norm=True), call("full")], dim=64, vocab=100))
    assert [r.params_executed for r in tail.extras if r.id == "head"] == [3 * 64]
    nested = estimate(model([loop(3, loop(2, call("full"), final_norm=True))], dim=64, vocab=100))
    assert [r.params_executed for r in nested.extras if r.id == "head"] == [7 * 64]


def test_repeat_copies_have_separate_weights():
    single = estimate(model([call("full")], dim=128))
    four = estimate(model([n.Repeat(n=4, body=(call("full"),))], dim=128))
    per_block = single.params.stored - single.params.embedding - 128
    assert four.params.stored == single.params.stored + 3 * per_block


def test_sandwich_norm_has_four_norms_per_block():
    pre = estimate(model([call("full")], dim=128))
    sandwich = estimate(model([call("full")], dim=128, norm="sandwich"))
    assert sandwich.params.stored - pre.params.stored == 2 * 128


def test_par_block_sums_its_mixers():
    m = model([n.Par(calls=(call("gdn"), call("swa")))], dim=128, mlp=n.NoneVal())
    b, _ = blocks(m.body)[0]
    gdn, swa = b.mixers
    mixers = lookup("gdn").params(gdn.opts, m.config) + lookup("swa").params(swa.opts, m.config)
    assert block_params(b, m.config) == mixers + 128  # one pre-norm, no MLP


def test_swiglu_default_hidden_rounds_to_256():
    m = model([call("full")], dim=2048)
    assert m.config.mlp.hidden == 5632  # 8/3·2048 = 5461.3 → 5632
