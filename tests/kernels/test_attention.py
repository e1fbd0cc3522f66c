"""`attention`: reference vs per-query truth, window edges, gates, GQA, Tq < Tk, varlen, decode.

The Triton backend runs the same checks under TRITON_INTERPRET=1 on CPU (small shapes) and at full
size on the GPU (`@pytest.mark.gpu`).
"""

import pytest
import torch

from lt2dsl.kernels.attention import attention, attention_decode, attention_naive
from lt2dsl.kernels.attention.recipe import RECIPES, AttnRecipe, default_recipe
from lt2dsl.kernels.attention.triton_bwd import N_BWD_CONFIGS
from tests.kernels.utils import DEVICE, assert_close, seeded_like

F64 = torch.float64


def make(B, Tq, Tk, HQ, HKV, D, dtype=F64, gate=None, device="cpu", seed=0):
    """Random q, k, v (and gate logits: None, 'elem' or 'head')."""
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=F64).to(device=device, dtype=dtype)

    q, k, v = r(B, Tq, HQ, D), r(B, Tk, HKV, D), r(B, Tk, HKV, D)
    gt = None if gate is None else (r(B, Tq, HQ, D) if gate == "elem" else r(B, Tq, HQ))
    return q, k, v, gt


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("window", [None, 1, 7, "T", "T+5"])
def test_reference_equals_naive(T, window):
    w = {"T": T, "T+5": T + 5}.get(window, window)
    q, k, v, g = make(2, T, T, 4, 2, 16, gate="elem")
    out = attention(q, k, v, window=w, gate=g)
    assert_close("o", out, attention_naive(q, k, v, window=w, gate=g), 1e-10)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [(3, 3), (6, 2), (4, 1)])
@pytest.mark.parametrize("gate", [None, "elem", "head"])
def test_reference_gqa_gate_prefill(causal, heads, gate):
    """Tq < Tk: the queries are the last positions (prefill onto a cache)."""
    q, k, v, g = make(2, 9, 40, heads[0], heads[1], 16, gate=gate)
    out = attention(q, k, v, causal=causal, gate=g)
    assert_close("o", out, attention_naive(q, k, v, causal=causal, gate=g), 1e-10)


@pytest.mark.parametrize("w", [1, 2, 5, 30, 31, 50])
def test_window_convention_edges(w):
    """mixers.md §9: key j visible to query i iff i − w + 1 ≤ j ≤ i (w keys including itself).

    With v = identity rows, o[i] is the softmax row itself: its support must be exactly that band.
    """
    T = 30
    q, k, _, _ = make(1, T, T, 1, 1, 8)
    v = torch.eye(T, dtype=F64)[None, :, None, :]
    p = attention(q, k, v, window=w)[0, :, 0]
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    assert torch.equal(p > 0, (j <= i) & (j >= i - w + 1))
    assert torch.allclose(p.sum(-1), torch.ones(T, dtype=F64))


def test_gate_is_sigmoid_times_output():
    q, k, v, g = make(1, 20, 20, 2, 2, 8, gate="elem")
    assert_close("elem", attention(q, k, v, gate=g), torch.sigmoid(g) * attention(q, k, v), 1e-12)
    gh = g[..., 0]
    want = torch.sigmoid(gh)[..., None] * attention(q, k, v)
    assert_close("head", attention(q, k, v, gate=gh), want, 1e-12)


def test_reference_gradcheck():
    q, k, v, g = make(1, 6, 6, 2, 1, 4, gate="elem")
    args = [t.requires_grad_() for t in (q, k, v, g)]
    assert torch.autograd.gradcheck(lambda q, k, v, g: attention(q, k, v, window=3, gate=g), args)


def test_reference_varlen_equals_per_sequence():
    cu = torch.tensor([0, 13, 14, 50])
    q, k, v, g = make(1, 50, 50, 4, 2, 8, gate="head")
    out = attention(q, k, v, window=5, gate=g, cu_seqlens=cu)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        ref = attention_naive(q[:, a:b], k[:, a:b], v[:, a:b], window=5, gate=g[:, a:b])
        assert_close(f"seq {a}:{b}", out[:, a:b], ref, 1e-10)


def test_bad_shapes_raise():
    q, k, v, _ = make(1, 8, 8, 4, 2, 8)
    with pytest.raises(ValueError, match=r"\[B, Tk, HKV, K\]"):
        attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="multiple"):
        attention(q, k[:, :, :1].expand(1, 8, 3, 8), v[:, :, :1].expand(1, 8, 3, 8))
    with pytest.raises(ValueError, match="Tq"):
        attention(torch.randn(1, 9, 4, 8), k, v)
    with pytest.raises(ValueError, match="gate"):
        attention(q, k, v, gate=torch.randn(1, 8, 4, 3))
    with pytest.raises(ValueError, match="window"):
        attention(q, k, v, window=0)


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("Tq", [1, 3])
def test_decode_reference_linear_and_ring(window, Tq):
    """A linear cache and a ring buffer give the same result as attention over the whole sequence."""
    B, HQ, HKV, D, L = 3, 4, 2, 8, 12
    lens = torch.tensor([5, 12, 30])
    T = int(lens.max())
    q_all, k_all, v_all, g_all = make(B, T, T, HQ, HKV, D, gate="head")
    q = torch.stack([q_all[b, n - Tq : n] for b, n in enumerate(lens.tolist())])
    g = torch.stack([g_all[b, n - Tq : n] for b, n in enumerate(lens.tolist())])
    want = torch.stack(
        [
            attention_naive(
                q_all[b : b + 1, :n],
                k_all[b : b + 1, :n],
                v_all[b : b + 1, :n],
                window=window,
                gate=g_all[b : b + 1, :n],
            )[0, n - Tq :]
            for b, n in enumerate(lens.tolist())
        ]
    )
    lin_k = torch.zeros(B, T, HKV, D, dtype=F64)
    lin_v = torch.zeros_like(lin_k)
    ring_k = torch.full((B, L, HKV, D), float("nan"), dtype=F64)  # stale slots must never be read
    ring_v = ring_k.clone()
    for b, n in enumerate(lens.tolist()):
        lin_k[b, :n], lin_v[b, :n] = k_all[b, :n], v_all[b, :n]
        for p in range(n):
            ring_k[b, p % L], ring_v[b, p % L] = k_all[b, p], v_all[b, p]
    got = attention_decode(q, lin_k, lin_v, lens, window=window, gate=g)
    assert_close("linear", got, want, 1e-10)
    if window is not None:  # a ring of L slots serves windows with L >= w + Tq - 1
        ring_k = torch.nan_to_num(ring_k)  # unwritten slots of short rows: zeros, masked anyway
        ring_v = torch.nan_to_num(ring_v)
        got = attention_decode(q, ring_k, ring_v, lens, window=window, ring=True, gate=g)
        assert_close("ring", got, want, 1e-10)


# ---- Triton backend (CPU interpreter here; the gpu-marked tests repeat it at full size) ----------

TRITON_CASES = {
    # name: (B, Tq, Tk, HQ, HKV, D, causal, window, gate, dtype)
    "gqa": (2, 63, 63, 4, 2, 32, True, None, None, torch.float32),
    "window7-elem": (1, 100, 100, 2, 1, 16, True, 7, "elem", torch.float32),
    "T1-head": (2, 1, 1, 2, 2, 16, True, None, "head", torch.float32),
    "noncausal-prefill": (1, 9, 40, 3, 1, 16, False, None, None, torch.float32),
    "w>T-D24": (1, 37, 50, 2, 1, 24, True, 100, "elem", torch.float32),
    "bf16-w16-head": (1, 63, 63, 2, 1, 32, True, 16, "head", torch.bfloat16),
}


def check_triton_case(B, Tq, Tk, HQ, HKV, D, causal, window, gate, dtype, device=DEVICE, cu=None, recipe=""):
    """Triton forward and all gradients against the float64 reference; `recipe` names the
    backward's, or is an `AttnRecipe` the launchers run (fixed-length batches)."""
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    q, k, v, g = make(B, Tq, Tk, HQ, HKV, D, dtype=dtype, gate=gate, device=device)
    leaves = [t.requires_grad_() for t in (q, k, v, g) if t is not None]
    kw = dict(causal=causal, window=window, cu_seqlens=cu)
    if isinstance(recipe, AttnRecipe):
        out, grads, do = _by_launchers(q, k, v, g, causal, window, recipe)
    else:
        out = attention(q, k, v, gate=g, backend="triton", recipe=recipe, **kw)
        do = seeded_like(out)
        grads = torch.autograd.grad(out, leaves, do)
    ref_in = [t.detach().double().requires_grad_() for t in leaves]
    ref = attention(*ref_in[:3], gate=ref_in[3] if g is not None else None, **kw)
    ref_grads = torch.autograd.grad(ref, ref_in, do.double())
    assert_close("o", out, ref, tol)
    for name, a, b in zip("qkvg", grads, ref_grads):
        assert_close(f"d{name}", a, b, tol)


def _by_launchers(q, k, v, g, causal, window, recipe):
    """o, the gradients and dO of the forward and backward launchers run with `recipe`."""
    from lt2dsl.kernels.attention.triton_bwd import attn_bwd
    from lt2dsl.kernels.attention.triton_fwd import attn_fwd

    scale = q.shape[-1] ** -0.5
    o, lse = attn_fwd(q, k, v, g, scale, causal, window)
    do = seeded_like(o)
    dq, dk, dv, dg = attn_bwd(do, q, k, v, o, lse, g, scale, causal, window, recipe=recipe)
    return o, [dq, dk, dv] + ([dg] if g is not None else []), do


@pytest.mark.parametrize("case", list(TRITON_CASES))
def test_triton_matches_reference(case, poison):
    check_triton_case(*TRITON_CASES[case])


@pytest.mark.parametrize("case", ["gqa", "window7-elem", "w>T-D24", "bf16-w16-head"])
def test_triton_backward_uneven_tiles(case, poison, monkeypatch):
    """The GPU's autotuned backward tiles are uneven (dK/dV 128 keys x 32 rows, dQ 128 rows x 32
    keys); the row and key bands must hold for any pair: here 32 x 16 and 16 x 32 (and 16 x 32 for
    dQ from dS, read across the dK/dV kernel's 32-key tiles)."""
    from lt2dsl.kernels.attention import triton_bwd

    tiles = dict(
        kv=dict(BN=32, BM=16, num_warps=1, num_stages=1),
        q=dict(BM=32, BN=16, num_warps=1, num_stages=1),
        ds=dict(BM=16, BN=32, num_warps=1, num_stages=1),
    )
    monkeypatch.setattr(triton_bwd, "bwd_config", lambda D, dtype: tiles)
    check_triton_case(*TRITON_CASES[case])


DQ_CASES = dict(TRITON_CASES, **{"bf16-head": (2, 63, 63, 4, 2, 32, True, None, "head", torch.bfloat16)})


def _one_head_of_ds(case: str) -> AttnRecipe:
    """dQ from dS through a buffer of one kv head's dS: B·HKV launches of each kernel."""
    B, Tq, Tk, HQ, HKV, *_, dtype = DQ_CASES[case]
    return AttnRecipe(ds_bytes=(HQ // HKV) * Tq * Tk * dtype.itemsize)


@pytest.mark.parametrize("form", ["ds", "split", "ds-groups"])
@pytest.mark.parametrize("case", ["gqa", "T1-head", "noncausal-prefill", "bf16-head"])
def test_triton_dq_forms(case, form, poison):
    """dQ by each recipe: from the dS the dK/dV kernel writes (the default; "ds-groups" with a
    buffer of one kv head, so several launches share it) and by the split dQ kernel."""
    from lt2dsl.kernels.attention.triton_bwd import ds_group_heads

    recipe = _one_head_of_ds(case) if form == "ds-groups" else RECIPES[form]
    B, Tq, Tk, HQ, HKV, *_, dtype = DQ_CASES[case]
    heads = ds_group_heads(recipe, B, HQ, HKV, Tq, Tk, torch.empty(0, dtype=dtype))
    assert heads == {"ds": B * HKV, "split": 0, "ds-groups": 1}[form]
    check_triton_case(*DQ_CASES[case], recipe=recipe)


def test_triton_ds_budget_falls_back_to_split(poison):
    """A dS slab larger than the budget takes the split dQ kernel (and stays correct)."""
    from lt2dsl.kernels.attention.triton_bwd import ds_group_heads

    recipe = AttnRecipe(ds_bytes=0)
    assert ds_group_heads(recipe, 2, 4, 2, 63, 63, torch.empty(0)) == 0
    check_triton_case(*TRITON_CASES["gqa"], recipe=recipe)


def test_recipes_are_chosen_by_shape_and_named_ones_are_checked():
    assert default_recipe(None, None, 1, 0, 0) == RECIPES["ds"]
    split = ((7, None, 1, 0, 0), (None, [0, 3], 1, 0, 0), (None, None, 4, 3, 0), (None, None, 1, 0, -2))
    assert all(default_recipe(*call) == RECIPES["split"] for call in split)
    q, k, v, _ = make(1, 8, 8, 2, 1, 16, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="unknown attention recipe 'atomic'; known: ds, split"):
        attention(q, k, v, backend="triton", recipe="atomic")
    with pytest.raises(ValueError, match="needs no window"):
        attention(q, k, v, window=3, backend="triton", recipe="ds")
    with pytest.raises(ValueError, match="'ds' or 'split'"):
        AttnRecipe(dq="atomic")


def test_triton_window_one_is_identity(poison):
    q, k, v, _ = make(1, 40, 40, 2, 1, 16, dtype=torch.float32, device=DEVICE)
    assert_close("o", attention(q, k, v, window=1, backend="triton"), v.repeat_interleave(2, 2), 1e-6)


def test_triton_varlen(poison):
    cu = torch.tensor([0, 13, 14, 50], device=DEVICE)
    check_triton_case(1, 50, 50, 4, 2, 16, True, 5, "head", torch.float32, cu=cu)


def test_triton_compiles_fullgraph_and_counts_flops():
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v, g = make(1, 20, 20, 2, 1, 16, dtype=torch.float32, gate="head", device=DEVICE)

    def f(q, k, v, g):
        return attention(q, k, v, window=5, gate=g, backend="triton")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert_close("compiled", compiled(q, k, v, g), f(q, k, v, g), 1e-6)
    with FlopCounterMode(display=False) as fc:
        f(q, k, v, g)
    pairs = sum(min(i + 1, 5) for i in range(20))
    assert fc.get_total_flops() == 2 * 2 * (16 + 16) * pairs


def test_triton_rejects_float64():
    q, k, v, _ = make(1, 8, 8, 2, 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="float64"):
        attention(q, k, v, backend="triton")


GPU_SHAPES = [(2, 1000, 16, 16, 64), (2, 1000, 16, 4, 128), (1, 8192, 16, 16, 128), (2, 8192, 16, 2, 64)]


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "B{}-T{}-H{}/{}-D{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("mode", ["full", "w512-elem", "head"])
def test_gpu_full_size(shape, dtype, mode, poison):
    B, T, HQ, HKV, D = shape
    window, gate = {"full": (None, None), "w512-elem": (512, "elem"), "head": (None, "head")}[mode]
    check_triton_case(B, T, T, HQ, HKV, D, True, window, gate, dtype, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("config", range(N_BWD_CONFIGS))
@pytest.mark.parametrize("mode", ["full", "full-split", "full-groups", "w512-elem"])
def test_gpu_every_backward_config(config, mode, poison):
    """Each backward tile config the autotuner may pick on this GPU, forced one at a time (Hopper
    miscompiles are per config: /work/shared/bench/README.md). Full attention takes dQ from dS by
    default; "full-split" forces the split dQ kernel, "full-groups" a dS budget of two kv heads
    (eight launches of each kernel through one buffer)."""
    from lt2dsl.kernels.attention.triton_bwd import forced_bwd_config

    recipe = {"full-split": RECIPES["split"], "full-groups": AttnRecipe(ds_bytes=2 * 4 * 1000 * 1000 * 2)}
    window, gate = {"full": (None, None), "w512-elem": (512, "elem")}.get(mode, (None, None))
    shape = (2, 1000, 1000, 16, 4, 128, True, window, gate, torch.bfloat16)
    with forced_bwd_config(config):
        check_triton_case(*shape, device="cuda", recipe=recipe.get(mode, ""))


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_prefill_and_varlen(dtype, poison):
    check_triton_case(2, 300, 1500, 16, 4, 128, True, None, "elem", dtype, device="cuda")
    cu = torch.tensor([0, 1, 700, 701, 3000], device="cuda")
    check_triton_case(1, 3000, 3000, 8, 2, 64, True, 256, "head", dtype, device="cuda", cu=cu)


@pytest.mark.parametrize("ring,window,Tq", [(False, None, 1), (False, 5, 2), (True, 7, 1), (True, 6, 3)])
def test_triton_decode_matches_reference(ring, window, Tq, poison):
    B, HQ, HKV, D = 3, 4, 2, 16
    lens = torch.tensor([3, 40, 97], device=DEVICE)
    L = 12 if ring else 100
    q, k, v, _ = make(B, Tq, L, HQ, HKV, D, dtype=torch.float32, device=DEVICE)
    g = torch.randn(B, Tq, HQ, device=DEVICE)
    got = attention_decode(q, k, v, lens, window=window, ring=ring, gate=g, backend="triton")
    want = attention_decode(*(t.double() for t in (q, k, v)), lens, window=window, ring=ring, gate=g.double())
    assert_close("o", got, want, 1e-4)


def test_triton_decode_reads_strided_caches(poison):
    """Caches that are views (head-major `[B, HKV, cap, D]` buffers narrowed to the filled slots,
    as the lowering's reserved caches are) give the same output as contiguous copies."""
    B, HQ, HKV, D, L = 2, 4, 2, 16, 70
    q, k, v, _ = make(B, 1, L, HQ, HKV, D, dtype=torch.float32, device=DEVICE)
    bufs = [torch.full((B, HKV, 96, D), float("nan"), device=DEVICE) for _ in range(2)]
    for buf, t in zip(bufs, (k, v)):
        buf[:, :, :L] = t.transpose(1, 2)
    ks, vs = (buf[:, :, :L].transpose(1, 2) for buf in bufs)
    assert not ks.is_contiguous() and torch.equal(ks, k)
    lens = torch.tensor([L, 41], device=DEVICE)
    got = attention_decode(q, ks, vs, lens, window=33, backend="triton")
    want = attention_decode(q.double(), k.double(), v.double(), lens, window=33)
    assert_close("o", got, want, 1e-4)
    with torch.no_grad():
        routed = attention(q, ks, vs, window=33, backend="triton")
    assert_close("routed o", routed, attention(q.double(), k.double(), v.double(), window=33), 1e-4)


def test_triton_attention_routes_decode_without_grad(poison):
    """Tq = 1 without autograd goes through the flash-decoding kernel; same numbers as the reference."""
    q, k, v, g = make(2, 1, 70, 8, 2, 16, dtype=torch.float32, gate="elem", device=DEVICE)
    with torch.no_grad():
        got = attention(q, k, v, window=33, gate=g, backend="triton")
    want = attention(q.double(), k.double(), v.double(), window=33, gate=g.double())
    assert_close("o", got, want, 1e-4)


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("L", [4096, 131072])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_decode(L, dtype, poison):
    B, HQ, HKV, D = 2, 16, 16, 128
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    q, k, v, _ = make(B, 1, L, HQ, HKV, D, dtype=dtype, device="cuda")
    lens = torch.tensor([L, L // 3], device="cuda")
    for window, ring in [(None, False), (512, False)]:
        got = attention_decode(q, k, v, lens, window=window, ring=ring, backend="triton")
        want = attention_decode(q.double(), k.double(), v.double(), lens, window=window, ring=ring)
        assert_close(f"decode w={window}", got, want, tol)
    ring_k, ring_v = k[:, :512].contiguous(), v[:, :512].contiguous()
    got = attention_decode(q, ring_k, ring_v, lens, window=512, ring=True, backend="triton")
    want = attention_decode(q.double(), ring_k.double(), ring_v.double(), lens, window=512, ring=True)
    assert_close("ring", got, want, tol)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_reference_chunk_sizes_agree(chunk):
    from lt2dsl.kernels.attention import attention_reference

    q, k, v, g = make(2, 50, 60, 4, 2, 8, gate="elem")
    want = attention_naive(q, k, v, window=9, gate=g)
    assert_close("o", attention_reference(q, k, v, window=9, gate=g, chunk=chunk), want, 1e-10)
