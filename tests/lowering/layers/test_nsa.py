"""`nsa` layer (NativeSparseAttention): spec contract, decode = forward, the three branches against a
direct float64 computation of mixers.md §10, φ init, gradients, bad input, fx tracing."""

from __future__ import annotations

import functools
import math
from typing import ClassVar

import pytest
import torch

from lt2dsl.lowering.cache import Entry
from lt2dsl.lowering.layers.nsa import NativeSparseAttention
from lt2dsl.lowering.to_fx import trace
from tests.kernels.utils import assert_close
from tests.lowering.layers.contract import (
    F64,
    SPARSE_BAD_INPUTS,
    LayerContract,
    assert_cache_is_the_spec_layout,
    assert_traced_same,
    call_targets,
    gradcheck_params,
    model_config,
    resolved,
    rope,
    run_in_pieces,
    seeded_layer,
)

# l' = block, n = select (3 forced blocks + 1 chosen by score), w = window, l = cmp_block, d = stride
GEOMETRIES = {
    "l=4,d=2,l'=4": dict(block=4, select=4, window=5, cmp_block=4, stride=2),
    "l=d=l'=4": dict(block=4, select=4, window=3, cmp_block=4, stride=4),
    "l=4,d=2,l'=6": dict(block=6, select=4, window=4, cmp_block=4, stride=2),
}
VARIANTS = {
    "mean-gqa": dict(compress="mean", kv_heads=2),
    "mlp-mqa": dict(compress="mlp", kv_heads=1),
}


config = functools.partial(model_config, dim=32, heads=4, head_dim=8, kv_heads=2, max_len=64)


def make_layer(dtype=F64, seed=0, cfg=None, randomize=True, **given) -> NativeSparseAttention:
    """A layer with generic random weights (std 0.2; φ perturbed away from mean pooling)."""

    def perturb(name, p):
        if name.startswith("cmp_"):
            p.add_(0.1 * torch.randn_like(p))
        else:
            p.normal_(0, 0.2)

    return seeded_layer(
        NativeSparseAttention, "nsa", cfg or config(), given, dtype, seed, perturb if randomize else None
    )


# ---- independent float64 truth (mixers.md §10(b)) ---------------------------------------------------


def attend(q, K, V):
    """softmax(q·Kᵀ/√d) V for one query `[d]` over `[n, d]` keys; zeros when n = 0."""
    if K.shape[0] == 0:
        return torch.zeros_like(q)
    return torch.softmax(K @ q / math.sqrt(q.shape[0]), 0) @ V


def compress(layer, x, which: str):
    """φ over blocks [i·d, i·d + l) of `x [B, T, HKV, d]` -> `[B, NC, HKV, d]` (mean or learned map)."""
    o = layer.opts
    l, s, T = o["cmp_block"], o["stride"], x.shape[1]
    rows = []
    for i in range(max(0, (T - l) // s + 1)):
        X = x[:, i * s : i * s + l]  # [B, l, HKV, d]
        if o["compress"] == "mean":
            rows.append(X.mean(1))
        else:
            m = getattr(layer, f"cmp_{which}")
            flat = (X + m.pos[None, :, None]).permute(0, 2, 1, 3).flatten(-2)  # [B, HKV, l·d]
            rows.append(flat @ m.proj.weight.T + m.proj.bias)
    return torch.stack(rows, 1) if rows else x.new_zeros(x.shape[0], 0, *x.shape[2:])


def selected_blocks(p_cmp, t: int, o) -> list[int]:
    """Top-n selection blocks of a kv group at query t from its summed compressed probabilities."""
    a, b, lsel = o["block"] // o["stride"], o["cmp_block"] // o["stride"], o["block"]
    cur = t // lsel
    score = torch.zeros(cur + 1, dtype=F64)
    for j in range(cur + 1):
        for m in range(a):
            for u in range(b):
                if 0 <= a * j - m - u < p_cmp.shape[0]:
                    score[j] += p_cmp[a * j - m - u]
    forced = {0, cur, cur - 1}
    # forced blocks first, then by score; ties go to the lower block index
    order = sorted(range(cur + 1), key=lambda j: (j not in forced, -score[j].item(), j))
    return order[: o["select"]]


def truth(layer, x):
    o, P = layer.opts, dict(layer.named_parameters())
    H, HKV, d, (B, T) = o["heads"], o["kv_heads"], o["head_dim"], x.shape[:2]
    G, l, s, lsel, w = H // HKV, o["cmp_block"], o["stride"], o["block"], o["window"]
    q = rope((x @ P["q_proj.weight"].T).unflatten(-1, (H, d)), o["rope_theta"])
    k = rope((x @ P["k_proj.weight"].T).unflatten(-1, (HKV, d)), o["rope_theta"])
    v = (x @ P["v_proj.weight"].T).unflatten(-1, (HKV, d))
    g = torch.sigmoid(x @ P["g_proj.weight"].T).unflatten(-1, (H, 3))
    kc, vc = compress(layer, k, "k"), compress(layer, v, "v")
    out = torch.zeros(B, T, H, d, dtype=F64)
    for bb in range(B):
        for t in range(T):
            vis = [i for i in range(kc.shape[1]) if i * s + l - 1 <= t]
            for hk in range(HKV):
                p_sum = torch.zeros(kc.shape[1], dtype=F64)
                o_cmp = []
                for h in range(hk * G, (hk + 1) * G):
                    o_cmp.append(attend(q[bb, t, h], kc[bb, vis, hk], vc[bb, vis, hk]))
                    if vis:
                        p_sum[vis] += torch.softmax(kc[bb, vis, hk] @ q[bb, t, h] / math.sqrt(d), 0)
                blocks = selected_blocks(p_sum, t, o)
                sel = [j for j in range(t + 1) if j // lsel in blocks]
                win = list(range(max(0, t - w + 1), t + 1))
                for i, h in enumerate(range(hk * G, (hk + 1) * G)):
                    o_slc = attend(q[bb, t, h], k[bb, sel, hk], v[bb, sel, hk])
                    o_swa = attend(q[bb, t, h], k[bb, win, hk], v[bb, win, hk])
                    gc, gs, gw = g[bb, t, h]
                    out[bb, t, h] = gc * o_cmp[i] + gs * o_slc + gw * o_swa
    return out.flatten(-2) @ P["o_proj.weight"].T


# ---- tests ------------------------------------------------------------------------------------------


class TestNsa(LayerContract):
    KIND, CFG, BAD_GIVEN = "nsa", config(), GEOMETRIES["l=4,d=2,l'=4"]
    # the spec-weights contract runs each of the module's VARIANTS at the first geometry
    VARIANTS: ClassVar = {name: GEOMETRIES["l=4,d=2,l'=4"] | v for name, v in VARIANTS.items()}
    BAD_INPUTS: ClassVar = SPARSE_BAD_INPUTS | {"rank": ((2, 5, 32, 1), F64, r"\[B, T, D=32\]")}
    make = staticmethod(make_layer)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("L", [3, 11, 12])
def test_cache_after_prefill_is_the_spec_layout(dtype, L):
    layer = make_layer(dtype, **GEOMETRIES["l=4,d=2,l'=4"], **VARIANTS["mean-gqa"])
    entry = Entry()
    layer(torch.randn(2, L, 32, dtype=dtype), entry, 0)
    assert_cache_is_the_spec_layout("nsa", layer, entry, 2, L)
    assert all(t.dtype == dtype for t in entry.values())  # every NSA cache tensor is in the kv dtype


@pytest.mark.parametrize("pieces", [[1], [10], [5, 6]], ids=["1", "10", "5+6"])
@pytest.mark.parametrize("geometry", GEOMETRIES.values(), ids=GEOMETRIES.keys())
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_prefill_then_decode_equals_one_forward(variant, geometry, pieces):
    layer = make_layer(**geometry, **variant)
    x = torch.randn(2, 23, 32, dtype=F64)
    out, entry = run_in_pieces(layer, x, pieces)
    assert_close("decode", out, layer(x), 1e-12)
    assert_cache_is_the_spec_layout("nsa", layer, entry, 2, 23)


@pytest.mark.parametrize("geometry", GEOMETRIES.values(), ids=GEOMETRIES.keys())
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_branches_match_a_direct_computation(variant, geometry):
    layer = make_layer(**geometry, **variant)
    # 27 tokens: 5 selection blocks of 6, so even l' = 6 leaves one block to choose by score
    x = torch.randn(2, 27, 32, dtype=F64)
    assert_close("nsa", layer(x), truth(layer, x), 1e-12)


def test_learned_compression_starts_as_mean_pooling():
    """φ of `compress=mlp` is initialised to fla's mean pooling: same output as `compress=mean`."""
    geo = GEOMETRIES["l=4,d=2,l'=4"]
    mean = make_layer(compress="mean", **geo)
    mlp = NativeSparseAttention(resolved("nsa", config(), compress="mlp", **geo), config()).double()
    mlp.load_state_dict(mean.state_dict(), strict=False)
    x = torch.randn(2, 17, 32, dtype=F64)
    assert_close("phi init", mlp(x), mean(x), 1e-13)


def test_gradcheck_input_gates_and_compression():
    cfg = config(dim=8, heads=2, head_dim=4, kv_heads=1)
    layer = make_layer(
        cfg=cfg, block=2, select=2, window=2, cmp_block=2, stride=1, kv_heads=1, compress="mlp"
    )
    x = torch.randn(1, 7, 8, dtype=F64, requires_grad=True)
    names = [
        "q_proj.weight",
        "k_proj.weight",
        "v_proj.weight",
        "g_proj.weight",
        "cmp_k.proj.weight",
        "cmp_v.pos",
    ]
    # fast mode checks random projections of the Jacobian: one numerical JVP per input, not per element
    assert gradcheck_params(layer, x, names, fast_mode=True)


def test_bad_geometry_raises_value_error():
    with pytest.raises(ValueError, match=r"stride \(3\) does not divide .*E0507"):
        make_layer(block=4, cmp_block=4, stride=3)


def test_traces_with_one_core_node_and_same_results():
    layer = make_layer(**GEOMETRIES["l=4,d=2,l'=4"], **VARIANTS["mlp-mqa"])
    gm = trace(layer)
    targets = call_targets(gm)
    assert targets.count("nsa_attend") == 1 and targets.count("nsa_compress_kv") == 1
    assert_traced_same(gm, layer, torch.randn(2, 14, 32, dtype=F64), 9)
