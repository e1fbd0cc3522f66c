"""A whole-model decode step's kernel launches, counted on the CPU (`bench/decode_launches.py`: the
Triton path under the interpreter, launches and projection GEMMs stubbed and counted), stay at
most what they were when the decode step's fusions landed, so a lowering or fusion change that
adds launches to every step fails here instead of on the GPU's tok/s. Toy sizes, B = 1."""

from __future__ import annotations

import pytest

from bench import decode_launches as dl
from lt2dsl.env import triton_interpreting

# launches of one step, measured at the commit that set them (`bench/decode_launches.py`); the
# hybrid's steps include the combine kernel of each DSA application's split selection (24)
LIMITS = {
    "lt2_hybrid_gdn_dsa": {"engine": 1046, "dynamic": 1183},
    "ouro_looped_transformer": {"engine": 979, "dynamic": 1258},
    "gdn12": {"engine": 132, "dynamic": 127},
}
# what the fused step no longer launches: conv-history and RoPE concatenations, RoPE's arithmetic
GONE = ("aten::cat", "aten::addcmul", "aten::mul")


@pytest.mark.skipif(not triton_interpreting(), reason="counts launches under Triton's CPU interpreter")
@pytest.mark.parametrize("name", list(LIMITS))
def test_decode_step_launches_stay_at_most_their_count(name):
    counts = dl.count_model(name)
    for path, limit in LIMITS[name].items():
        c = counts[path]
        total = dl.totals(c)["total"]
        top = dict(c.most_common(8))
        assert total <= limit, f"{name} ({path}): {total} launches per step > {limit}; most: {top}"
        # the hybrid's DSA scales its indexer weights with a mul, but in the engine's scoring kernel
        if name != "lt2_hybrid_gdn_dsa" or path == "engine":
            assert not [k for k in GONE if c[k]], f"{name} ({path}) launches {[k for k in GONE if c[k]]}"
        assert not c["aten::cat"], f"{name} ({path}): {c['aten::cat']} cat launches"
    if name == "lt2_hybrid_gdn_dsa":
        # 72 GDN applications (4 loops × 6 × 3): one conv launch each for q, k and v; 24 DSA ones:
        # one RoPE launch for q and k that writes k and v into the cache, one for the indexer's q
        # and LayerNorm-ed k that writes k
        c = counts["engine"]
        assert c["triton:conv_silu_step_kernel"] == 72 and not c["triton:conv_silu_fwd_kernel"]
        assert c["triton:rope_cache_kernel"] == 48 and not c["triton:rope_fwd_kernel"]
        assert not c["aten::layer_norm"], "the index key's LayerNorm runs apart"
    if name != "gdn12":
        # every attention layer's cache writes happen in its RoPE kernel (no scatter of its own)
        c = counts["engine"]
        assert not c["aten::scatter_"], f"{name}: {c['aten::scatter_']} cache-write launches"
        assert c["triton:rope_cache_kernel"] == (48 if name == "lt2_hybrid_gdn_dsa" else 96)
    if name != "ouro_looped_transformer":
        # every GDN application's gates are formed in its recurrent kernel: no gate launch
        for path, c in counts.items():
            assert not c["triton:gdn_gate_fwd_kernel"], f"{name} ({path}) launches the GDN gates apart"
            assert c["triton:delta_recurrent_kernel"] == (72 if name == "lt2_hybrid_gdn_dsa" else 12)


# with the opt-in rule `decode_gemv`: launches of one step, the GEMV launches among them (two per
# add-norm between projections: all but the first in-projection, the last down_proj and the head),
# the GEMMs left and the add-norms left (the head's; the sandwich model's: each iteration's final norm)
GEMV_LIMITS = {
    "lt2_hybrid_gdn_dsa": (687, 382, 3, {"add_rmsnorm": 1}),
    "ouro_looped_transformer": (695, 376, 9, {"norm_add_rmsnorm": 4}),
    "gdn12": (85, 46, 3, {"add_rmsnorm": 1}),
}


@pytest.mark.skipif(not triton_interpreting(), reason="counts launches under Triton's CPU interpreter")
@pytest.mark.parametrize("name", list(GEMV_LIMITS))
def test_decode_gemv_rule_cuts_the_engine_step_only(name):
    counts = dl.count_model(name, ("decode_gemv",))
    limit, gemvs, gemms, norms = GEMV_LIMITS[name]
    e, d = counts["engine"], counts["dynamic"]
    assert dl.totals(e)["total"] <= limit, f"{name}: {dl.totals(e)} launches per step > {limit}"
    assert e["triton:gemv_kernel"] == gemvs and e["gemm"] == gemms, f"{name}: {dict(e.most_common(6))}"
    # the add-norms, SwiGLUs and GDN's gated norms between projections run inside the GEMVs
    for kind in ("add_rmsnorm", "norm_add_rmsnorm"):
        assert e[f"triton:{kind}_fwd_kernel"] == norms.get(kind, 0), f"{name}: {dict(e.most_common(8))}"
    assert not e["triton:swiglu_fwd_kernel"] and not e["triton:gated_rmsnorm_fwd_kernel"]
    # a dynamic cache runs the nodes the rule replaced
    assert not d["triton:gemv_kernel"] and dl.totals(d)["total"] <= LIMITS[name]["dynamic"]


@pytest.mark.skipif(not triton_interpreting(), reason="counts launches under Triton's CPU interpreter")
def test_nsa_decode_step_reads_no_dense_buffer():
    """The NSA example's engine step (toy sizes; 24 NSA blocks looped ×4: 96 applications): per
    application one launch compresses the block a step completes (k and v), one forms
    the compressed branch and the block choice, one sparse-attention launch reads the chosen
    blocks' tokens and the window's, one merges them and mixes the branches. The only GEMMs left
    are the projections (4 an application and the head): the dense reference's products over the
    whole buffer are gone (961 GEMMs and 19,889 launches a step before f3f2e23, 1,169 now); the RoPE
    kernel writes k and v into the cache (no scatter), the combine takes the gates' sigmoids."""
    c = dl.count_model("lt2_sparse_nsa")["engine"]
    assert dl.totals(c)["total"] <= 1169, f"{dl.totals(c)}; most: {dict(c.most_common(8))}"
    assert c["gemm"] == 96 * 4 + 1
    assert c["triton:nsa_decode_compress_kernel"] == 96
    assert c["triton:nsa_decode_select_kernel"] == 96 and c["triton:nsa_decode_combine_kernel"] == 96
    assert c["triton:_sparse_split_kernel"] == 96 and not c["triton:_sparse_combine_kernel"]
    assert c["triton:rope_cache_kernel"] == 96 and not c["aten::scatter_"] and not c["aten::sigmoid"]


@pytest.mark.skipif(not triton_interpreting(), reason="counts launches under Triton's CPU interpreter")
def test_gdn_decode_rule_takes_two_launches_a_gdn_application():
    """With the opt-in rule `gdn_decode` each of the hybrid's 72 GDN applications runs its convs,
    recurrence and gated norm in two launches, not three, in both steps: 1,046 → 974 (engine)."""
    counts = dl.count_model("lt2_hybrid_gdn_dsa", ("gdn_decode",))
    for path, c in counts.items():
        assert c["triton:gdn_step_recurrent_kernel"] == 72 and c["triton:gdn_step_norm_kernel"] == 72, path
        for gone in ("conv_silu_step_kernel", "delta_recurrent_kernel", "gated_rmsnorm_fwd_kernel"):
            assert not c[f"triton:{gone}"], f"{path} launches {gone}"
    assert dl.totals(counts["engine"])["total"] <= 974
