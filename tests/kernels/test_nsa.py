"""`nsa`: reference vs per-query truth, forced blocks, t < block size, general compression, varlen."""

import pytest
import torch

from lt2dsl.kernels.attention import attention_naive
from lt2dsl.kernels.nsa import nsa, nsa_naive
from tests.kernels.utils import DEVICE, assert_close, seeded_like

F64 = torch.float64


def make(B, Tq, Tk, HQ, HKV, D, dtype=F64, device="cpu", seed=0):
    """Random q, k, v and three gates in (0, 1)."""
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=F64).to(device=device, dtype=dtype)

    q, k, v = r(B, Tq, HQ, D), r(B, Tk, HKV, D), r(B, Tk, HKV, D)
    gates = [torch.sigmoid(r(B, Tq, HQ)) for _ in range(3)]
    return q, k, v, gates


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("heads", [(4, 4), (4, 1), (6, 2)])
def test_reference_equals_naive(T, heads):
    q, k, v, gs = make(2, T, T, *heads, 16)
    kw = dict(block_counts=3, block_size=16, window_size=8)
    o, idx = nsa(q, k, v, *gs, return_block_indices=True, **kw)
    o2, idx2 = nsa_naive(q, k, v, *gs, **kw)
    assert torch.equal(idx, idx2)
    assert_close("o", o, o2, 1e-10)


@pytest.mark.parametrize("geo", [(8, 4), (16, 8), (8, 8)])
def test_general_compression_equals_naive(geo):
    """The paper's separate compression block l and stride d (l' = 16)."""
    q, k, v, gs = make(1, 70, 70, 4, 2, 8)
    kw = dict(block_counts=2, block_size=16, window_size=0, cmp_block=geo[0], cmp_stride=geo[1])
    o, idx = nsa(q, k, v, *gs, return_block_indices=True, **kw)
    o2, idx2 = nsa_naive(q, k, v, *gs, **kw)
    assert torch.equal(idx, idx2)
    assert_close("o", o, o2, 1e-10)


def test_short_sequence_before_first_block():
    """t < block size: no compressed block visible (o_cmp = 0), selection = block 0 = causal attention."""
    q, k, v, gs = make(2, 10, 10, 2, 1, 8)
    o = nsa(q, k, v, gs[0], None, None, block_counts=4, block_size=16)
    assert_close("o", o, attention_naive(q, k, v), 1e-10)


def test_forced_blocks_and_padding():
    T, bs = 100, 8
    q, k, v, gs = make(1, T, T, 4, 2, 8)
    _, idx = nsa(q, k, v, *gs, block_counts=5, block_size=bs, return_block_indices=True)
    for t in range(T):
        cur = t // bs
        for h in range(2):
            row = [j for j in idx[0, t, h].tolist() if j >= 0]
            want_n = min(5, cur + 1)
            assert len(row) == want_n == len(set(row)) and max(row) <= cur
            assert {0, cur, max(cur - 1, 0)} <= set(row)


def test_full_selection_is_causal_attention():
    """Selecting every block with only the selected branch = causal attention."""
    q, k, v, _ = make(1, 40, 40, 4, 2, 8)
    o = nsa(
        q,
        k,
        v,
        None,
        None,
        None,
        block_counts=5,
        block_size=8,
        block_indices=torch.arange(5).expand(1, 40, 2, 5),
    )
    assert_close("o", o, attention_naive(q, k, v), 1e-10)


def test_prefill_and_block_counts_tensor():
    q, k, v, gs = make(2, 9, 50, 4, 2, 8)
    counts = torch.randint(1, 4, (2, 9, 2))
    kw = dict(block_counts=counts, block_size=8, window_size=6)
    o, idx = nsa(q, k, v, *gs, return_block_indices=True, **kw)
    o2, idx2 = nsa_naive(q, k, v, *gs, **kw)
    assert torch.equal(idx, idx2)
    assert_close("o", o, o2, 1e-10)


def test_learned_compression_gets_gradients():
    q, k, v, gs = make(1, 33, 33, 2, 1, 8)
    kc = torch.randn(1, 4, 1, 8, dtype=F64, requires_grad=True)
    vc = torch.randn(1, 4, 1, 8, dtype=F64, requires_grad=True)
    kw = dict(block_counts=2, block_size=8, k_cmp=kc, v_cmp=vc)
    o = nsa(q, k, v, *gs, **kw)
    assert_close("o", o, nsa_naive(q, k, v, *gs, **kw)[0], 1e-10)
    o.sum().backward()
    assert kc.grad.abs().sum() > 0 and vc.grad.abs().sum() > 0


def test_reference_gradcheck():
    q, k, v, gs = make(1, 9, 9, 2, 1, 4)
    args = [t.requires_grad_() for t in (q, k, v, *gs)]

    def f(q, k, v, a, b, c):
        return nsa(q, k, v, a, b, c, block_counts=2, block_size=4, window_size=3)

    assert torch.autograd.gradcheck(f, args, fast_mode=True)


def test_varlen_equals_per_sequence():
    cu = torch.tensor([0, 17, 18, 60])
    q, k, v, gs = make(1, 60, 60, 4, 2, 8)
    kw = dict(block_counts=2, block_size=8, window_size=5)
    o = nsa(q, k, v, *gs, cu_seqlens=cu, **kw)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        ref = nsa_naive(q[:, a:b], k[:, a:b], v[:, a:b], *(g[:, a:b] for g in gs), **kw)[0]
        assert_close(f"seq {a}:{b}", o[:, a:b], ref, 1e-10)


def test_bad_args_raise():
    q, k, v, gs = make(1, 8, 8, 2, 1, 8)
    with pytest.raises(ValueError, match=r"\[B, Tq, HQ\]"):
        nsa(q, k, v, gs[0][..., :1], None, None)
    with pytest.raises(ValueError, match="cmp_stride"):
        nsa(q, k, v, *gs, block_size=8, cmp_block=8, cmp_stride=3)


# ---- Triton backend ------------------------------------------------------------------------------


def check_triton(B, Tq, Tk, HQ, HKV, D, dtype, device=DEVICE, grads=True, **kw):
    """Triton NSA vs the float64 reference: same blocks (fp32), outputs and every gradient."""
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    q, k, v, gs = make(B, Tq, Tk, HQ, HKV, D, dtype=dtype, device=device)
    leaves = [t.requires_grad_() for t in (q, k, v, *gs)]
    o, idx = nsa(q, k, v, *gs, return_block_indices=True, backend="triton", **kw)
    if dtype == torch.float32:
        ref_idx = nsa(*(t.detach().double() for t in (q, k, v, *gs)), return_block_indices=True, **kw)[1]
        assert (idx != ref_idx).float().mean() < 0.01  # a near-tie may swap a block between fp32 and fp64
    ref_in = [t.detach().double().requires_grad_() for t in leaves]
    ref = nsa(*ref_in, block_indices=idx, **kw)
    assert_close("o", o, ref, tol)
    if not grads:
        return
    do = seeded_like(o)
    used = [i for i, t in enumerate(leaves) if i != 5 or kw.get("window_size", 0) > 0]
    got = torch.autograd.grad(o, [leaves[i] for i in used], do)
    want = torch.autograd.grad(ref, [ref_in[i] for i in used], do.double())
    for i, a, b in zip(used, got, want):
        assert_close(["dq", "dk", "dv", "dg_cmp", "dg_slc", "dg_swa"][i], a, b, tol)


def test_triton_matches_reference(poison):
    check_triton(1, 30, 30, 2, 1, 16, torch.float32, block_counts=2, block_size=8, window_size=6)


@pytest.mark.parametrize("tiles", [(32, 16), (16, 32)], ids=["kv32x16", "kv16x32"])
def test_triton_backward_uneven_tiles(tiles, poison, monkeypatch):
    """The compressed branch's strided keys (`kstride`) under the uneven backward tiles the GPU
    autotunes among (attention/triton_bwd.py): the row and key bands hold for any pair."""
    from lt2dsl.kernels.attention import triton_bwd

    bn, bm = tiles
    one = dict(num_warps=1, num_stages=1)
    cfg = dict(kv=dict(BN=bn, BM=bm, **one), q=dict(BM=bn, BN=bm, **one))
    monkeypatch.setattr(triton_bwd, "bwd_config", lambda D, dtype: cfg)
    check_triton(1, 30, 30, 2, 1, 16, torch.float32, block_counts=2, block_size=8, window_size=6)


def test_triton_decode_and_general_compression(poison):
    check_triton(1, 2, 40, 4, 2, 16, torch.float32, grads=False, block_counts=3, block_size=8, window_size=5)
    check_triton(
        1,
        26,
        26,
        2,
        1,
        16,
        torch.float32,
        grads=False,
        block_counts=2,
        block_size=8,
        cmp_block=8,
        cmp_stride=4,
    )


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    "shape",
    [(2, 1000, 16, 1, 64), (1, 4096, 16, 4, 128), (2, 1000, 8, 8, 64)],
    ids=lambda s: "B{}-T{}-H{}/{}-D{}".format(*s),
)
def test_gpu_full_size(shape, dtype, poison):
    B, T, HQ, HKV, D = shape
    check_triton(B, T, T, HQ, HKV, D, dtype, device="cuda", block_counts=16, block_size=64, window_size=512)


@pytest.mark.gpu
def test_gpu_peer_reference_same_function():
    """Same function as the peer's `naive_nsa` (fla) with its defaults (needs G ≥ 16 and flash-attn there)."""
    naive = pytest.importorskip("fla.ops.nsa.naive")
    pytest.importorskip("flash_attn")
    q, k, v, gs = make(1, 512, 512, 16, 1, 64, dtype=torch.bfloat16, device="cuda")
    kw = dict(block_counts=4, block_size=64, window_size=128)
    peer, peer_idx = naive.naive_nsa(q, k, v, *gs, return_block_indices=True, **kw)
    ours, idx = nsa(q, k, v, *gs, return_block_indices=True, backend="triton", **kw)
    assert (idx.sort(-1).values != peer_idx.sort(-1).values).float().mean() < 0.01
    assert_close("o", ours, peer, 2e-2)


def test_triton_compiles_fullgraph(poison):
    q, k, v, gs = make(1, 20, 20, 2, 1, 16, dtype=torch.float32, device=DEVICE)

    def f(q, k, v, a, b, c):
        return nsa(q, k, v, a, b, c, block_counts=2, block_size=8, window_size=4, backend="triton")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert_close("compiled", compiled(q, k, v, *gs), f(q, k, v, *gs), 1e-6)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_reference_chunk_sizes_agree(chunk):
    from lt2dsl.kernels.nsa.reference import nsa_reference

    q, k, v, gs = make(1, 40, 40, 4, 2, 8)
    kw = dict(block_counts=2, block_size=8, window_size=5)
    o, idx = nsa_reference(q, k, v, *gs, chunk=chunk, **kw)
    o2, idx2 = nsa_naive(q, k, v, *gs, **kw)
    assert torch.equal(idx, idx2)
    assert_close("o", o, o2, 1e-10)
