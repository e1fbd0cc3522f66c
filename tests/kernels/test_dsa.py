"""`dsa`: reference vs per-query truth, fewer-than-k keys, k ≥ T = dense causal, KL loss, varlen."""

import pytest
import torch

from lt2dsl.kernels.attention import attention_naive
from lt2dsl.kernels.dsa import dsa, dsa_indexer, dsa_indexer_kl, dsa_naive
from tests.kernels.utils import DEVICE, assert_close, seeded_like

F64 = torch.float64


def make(B, Tq, Tk, HQ, HKV, D, HI=3, DI=8, dtype=F64, device="cpu", seed=0, positive=False):
    """Random DSA inputs; `positive` makes every index dot product > 0 (no ReLU ties at 0)."""
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        x = torch.randn(*s, generator=g, dtype=F64)
        return x.to(device=device, dtype=dtype)

    q, k, v = r(B, Tq, HQ, D), r(B, Tk, HKV, D), r(B, Tk, HKV, D)
    qi, ki, wi = r(B, Tq, HI, DI), r(B, Tk, DI), r(B, Tq, HI)
    if positive:
        qi, ki, wi = qi.abs(), ki.abs(), wi.abs()
    return q, k, v, qi, ki, wi


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("topk", [1, 8, "T", "T+3"])
def test_reference_equals_naive(T, topk):
    kk = {"T": T, "T+3": T + 3}.get(topk, topk)
    args = make(2, T, T, 4, 2, 16)
    o, idx = dsa(*args, topk=kk, return_indices=True)
    o2, idx2 = dsa_naive(*args, topk=kk)
    assert torch.equal(idx, idx2)
    assert_close("o", o, o2, 1e-10)


def test_fewer_than_k_valid_keys_are_padded():
    T, kk = 20, 8
    q, k, v, qi, ki, wi = make(1, T, T, 2, 1, 8)
    idx = dsa_indexer(qi, ki, wi, topk=kk)
    for t in range(T):
        row = idx[0, t]
        n = min(kk, t + 1)
        assert (row[:n] >= 0).all() and (row[:n] <= t).all() and (row[n:] == -1).all()
        assert len(set(row[:n].tolist())) == n


@pytest.mark.parametrize("Tq", [100, 7])
def test_k_at_least_T_is_dense_causal(Tq):
    q, k, v, qi, ki, wi = make(2, Tq, 100, 6, 3, 16)
    o = dsa(q, k, v, qi, ki, wi, topk=100)
    assert_close("o", o, attention_naive(q, k, v), 1e-10)


def test_selection_follows_the_index_score():
    """The selection is the k highest I[t, s] = Σ_j w·ReLU(s·q·k) among s ≤ t (peer's formula)."""
    T, kk = 30, 5
    _, _, _, qi, ki, wi = make(1, T, T, 1, 1, 4)
    idx = dsa_indexer(qi, ki, wi, topk=kk)
    score = (wi[0, :, :, None] * torch.relu(torch.einsum("thd,sd->ths", qi[0], ki[0]) * 8**-0.5)).sum(1)
    score = score.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    for t in range(kk, T):
        assert torch.equal(score[t, idx[0, t]], torch.topk(score[t], kk).values)


def test_ties_go_to_the_lower_index():
    T = 12
    _, _, _, qi, ki, wi = make(1, T, T, 1, 1, 4, positive=True)
    ki = ki[:, :1].expand(1, T, ki.shape[-1]).contiguous()  # every key scores the same
    idx = dsa_indexer(qi, ki, wi, topk=3)
    for t in range(T):
        assert idx[0, t, : min(3, t + 1)].tolist() == list(range(min(3, t + 1)))


def test_precomputed_indices_and_prefill():
    q, k, v, qi, ki, wi = make(2, 10, 50, 4, 1, 8)
    o, idx = dsa(q, k, v, qi, ki, wi, topk=6, return_indices=True)
    assert_close("given indices", dsa(q, k, v, None, None, None, topk=6, indices=idx), o, 1e-12)
    o2, idx2 = dsa_naive(q, k, v, qi, ki, wi, topk=6)
    assert torch.equal(idx, idx2)
    assert_close("Tq < Tk", o, o2, 1e-10)


def test_reference_gradcheck():
    q, k, v, qi, ki, wi = make(1, 6, 6, 2, 1, 4)
    idx = dsa_indexer(qi, ki, wi, topk=3)
    args = [t.requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda q, k, v: dsa(q, k, v, None, None, topk=3, indices=idx), args)


def test_varlen_equals_per_sequence():
    cu = torch.tensor([0, 9, 10, 40])
    q, k, v, qi, ki, wi = make(1, 40, 40, 4, 2, 8)
    o, idx = dsa(q, k, v, qi, ki, wi, topk=5, cu_seqlens=cu, return_indices=True)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        o2, idx2 = dsa_naive(q[:, a:b], k[:, a:b], v[:, a:b], qi[:, a:b], ki[:, a:b], wi[:, a:b], topk=5)
        assert torch.equal(idx[:, a:b], idx2)
        assert_close(f"seq {a}:{b}", o[:, a:b], o2, 1e-10)


def _kl_by_loop(q, k, qi, ki, wi, idx_scale, indices=None):
    """Σ_t KL(p_t ‖ softmax I_t) written out one query at a time."""
    B, T, HQ, D = q.shape
    G = HQ // k.shape[2]
    total = 0.0
    for b in range(B):
        for t in range(T):
            keys = torch.arange(t + 1) if indices is None else indices[b, t][indices[b, t] >= 0]
            s = torch.einsum("hd,nhd->hn", q[b, t] * D**-0.5, k[b, keys].repeat_interleave(G, 1))
            p = torch.softmax(s, -1).sum(0)
            p = p / p.sum()
            logit = (wi[b, t][:, None] * torch.relu(idx_scale * qi[b, t] @ ki[b, keys].T)).sum(0)
            total = total + (p * (p.log() - torch.log_softmax(logit, -1))).sum()
    return total


@pytest.mark.parametrize("sparse", [False, True])
def test_kl_loss_matches_loop_and_trains_only_the_indexer(sparse):
    q, k, v, qi, ki, wi = make(2, 12, 12, 4, 2, 8, HI=2, DI=4)
    idx = dsa_indexer(qi, ki, wi, topk=4) if sparse else None
    for t in (q, k, qi, ki, wi):
        t.requires_grad_()
    loss = dsa_indexer_kl(q, k, qi, ki, wi, indices=idx)
    want = _kl_by_loop(q.detach(), k.detach(), qi, ki, wi, (2 * 4) ** -0.5, idx)
    assert_close("kl", loss, want, 1e-10)
    assert loss.item() >= 0
    loss.backward()
    assert q.grad is None and k.grad is None
    assert qi.grad.abs().sum() > 0 and wi.grad.abs().sum() > 0


def test_bad_shapes_raise():
    q, k, v, qi, ki, wi = make(1, 8, 8, 2, 1, 8)
    with pytest.raises(ValueError, match=r"\[B, Tk, DI\]"):
        dsa(q, k, v, qi, ki[..., :3], wi, topk=2)
    with pytest.raises(ValueError, match=r"\[B, Tq, HI\]"):
        dsa(q, k, v, qi, ki, wi[..., :1], topk=2)


# ---- Triton backend ------------------------------------------------------------------------------


def check_triton(B, Tq, HQ, HKV, D, topk, dtype, device=DEVICE, HI=3, DI=16, cu=None):
    """Triton indexer selects a valid top-k; Triton attention over it matches the float64 reference.

    The selection is compared through the reference scores (a near-tie may legitimately swap one
    key between fp32 and float64); the attention and all its gradients are compared on that selection.
    """
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    q, k, v, qi, ki, wi = make(B, Tq, Tq, HQ, HKV, D, HI=HI, DI=DI, dtype=dtype, device=device)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    o, idx = dsa(q, k, v, qi, ki, wi, topk=topk, cu_seqlens=cu, return_indices=True, backend="triton")
    ref_idx = dsa_indexer(qi.double(), ki.double(), wi.double(), topk=topk) if cu is None else None
    if ref_idx is not None:
        from lt2dsl.kernels.dsa.reference import indexer_scores

        s = indexer_scores(qi.double(), ki.double(), wi.double(), DI**-0.5, F64)
        got = torch.where(idx >= 0, s.gather(-1, idx.clamp(min=0)), 0).sum(-1)
        want = torch.where(ref_idx >= 0, s.gather(-1, ref_idx.clamp(min=0)), 0).sum(-1)
        assert_close("selected score mass", got, want, 1e-3 if dtype == torch.float32 else 2e-2)
        assert torch.equal(idx < 0, ref_idx < 0)
    do = seeded_like(o)
    grads = torch.autograd.grad(o, leaves, do)
    ref_in = [t.detach().double().requires_grad_() for t in leaves]
    ref = dsa(*ref_in, None, None, topk=topk, indices=idx, cu_seqlens=cu)
    ref_grads = torch.autograd.grad(ref, ref_in, do.double())
    assert_close("o", o, ref, tol)
    for name, a, b in zip("qkv", grads, ref_grads):
        assert_close(f"d{name}", a, b, tol)


@pytest.mark.parametrize("case", [(1, 24, 4, 2, 16, 6), (1, 20, 2, 1, 32, 30), (2, 1, 4, 1, 16, 4)])
def test_triton_matches_reference(case, poison):
    check_triton(*case, dtype=torch.float32)


def test_triton_bf16_and_varlen(poison):
    check_triton(1, 18, 2, 1, 16, 5, dtype=torch.bfloat16)
    check_triton(1, 20, 2, 2, 16, 4, dtype=torch.float32, cu=torch.tensor([0, 7, 8, 20], device=DEVICE))


def test_triton_indexer_equals_reference_in_fp32():
    _, _, _, qi, ki, wi = make(2, 40, 40, 1, 1, 8, HI=3, DI=16, dtype=torch.float32, device=DEVICE)
    for kk in (1, 8, 50):
        got = dsa_indexer(qi, ki, wi, topk=kk, backend="triton")
        assert torch.equal(got, dsa_indexer(qi, ki, wi, topk=kk))


@pytest.mark.parametrize("Tq,Tk", [(48, 48), (30, 50)])
@pytest.mark.parametrize("chunk", [16, 32, None])
def test_triton_indexer_query_chunks_trim_the_keys(Tq, Tk, chunk):
    """Each query chunk scores and selects only the keys its last row can see; chunked or not,
    with queries at the end of a longer key range or not, and a top-k above what early rows see,
    the selection equals the reference's exactly (fp32)."""
    from lt2dsl.kernels.dsa.triton_indexer import dsa_indexer_triton

    _, _, _, qi, ki, wi = make(2, Tq, Tk, 1, 1, 8, HI=3, DI=16, dtype=torch.float32, device=DEVICE)
    for kk in (5, 40):
        got = dsa_indexer_triton(qi, ki, wi, topk=kk, chunk=chunk)
        assert torch.equal(got, dsa_indexer(qi, ki, wi, topk=kk)), (kk, chunk)


def test_triton_decode_over_index_cache(poison):
    """Tq < Tk (queries are the last positions): the lowering's decode path."""
    q, k, v, qi, ki, wi = make(2, 2, 40, 4, 1, 16, dtype=torch.float32, device=DEVICE)
    o, idx = dsa(q, k, v, qi, ki, wi, topk=8, return_indices=True, backend="triton")
    assert torch.equal(idx, dsa_indexer(qi, ki, wi, topk=8))
    ref = dsa(q.double(), k.double(), v.double(), None, None, topk=8, indices=idx)
    assert_close("o", o, ref, 1e-4)


def test_triton_reads_strided_kv(poison):
    """k, v as head-major views of larger NaN-filled buffers (the lowering's KV cache) give the
    same output as contiguous copies, forward and backward."""
    q, k, v, qi, ki, wi = make(2, 3, 40, 4, 2, 16, dtype=torch.float32, device=DEVICE)
    bufs = [torch.full((2, 2, 64, 16), float("nan"), device=DEVICE) for _ in range(2)]
    for buf, t in zip(bufs, (k, v)):
        buf[:, :, :40] = t.transpose(1, 2)
    ks, vs = (buf[:, :, :40].transpose(1, 2).requires_grad_() for buf in bufs)
    assert not ks.is_contiguous()
    o, idx = dsa(q, ks, vs, qi, ki, wi, topk=8, return_indices=True, backend="triton")
    k2, v2 = k.clone().requires_grad_(), v.clone().requires_grad_()
    ref = dsa(q.double(), k2.double(), v2.double(), None, None, topk=8, indices=idx)
    assert_close("o", o, ref, 1e-4)
    do = seeded_like(o)
    o.backward(do)
    ref.backward(do.double())
    assert_close("dk", ks.grad, k2.grad, 1e-4)
    assert_close("dv", vs.grad, v2.grad, 1e-4)


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    "shape",
    [(2, 1000, 16, 1, 64, 256), (1, 4096, 16, 2, 128, 2048), (2, 1000, 16, 16, 128, 64)],
    ids=lambda s: "B{}-T{}-H{}/{}-D{}-k{}".format(*s),
)
def test_gpu_full_size(shape, dtype, poison):
    check_triton(*shape, dtype=dtype, device="cuda", HI=4, DI=64)


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("T", [4096, 1000])
def test_gpu_radix_set_equals_torch_topk(T):
    """On the H200 at full size: the radix selection (`ordered=False`) picks the same sets as the
    int64-key `torch.topk` (rank order); both score in the same kernel code."""
    from lt2dsl.kernels.dsa import triton_indexer

    _, _, _, qi, ki, wi = make(2, T, T, 1, 1, 8, HI=4, DI=64, dtype=torch.bfloat16, device="cuda")
    ref = triton_indexer.dsa_indexer_triton(qi, ki, wi, topk=2048)
    got = triton_indexer.dsa_indexer_triton(qi, ki, wi, topk=2048, ordered=False)
    assert torch.equal(got.sort(-1).values, ref.sort(-1).values)


@pytest.mark.gpu
def test_gpu_peer_reference_same_function():
    """Same function as the peer's `naive_dsa` (fla) on the same inputs (no score ties: positive inputs)."""
    naive = pytest.importorskip("fla.ops.dsa.naive")
    q, k, v, qi, ki, wi = make(
        2, 300, 300, 8, 2, 64, HI=4, DI=32, dtype=torch.float32, device="cuda", positive=True
    )
    peer, peer_idx = naive.naive_dsa(q, k, v, qi, ki, wi, topk=64, return_indices=True)
    ours, idx = dsa(q, k, v, qi, ki, wi, topk=64, return_indices=True, backend="triton")
    assert torch.equal(idx.sort(-1).values, peer_idx.sort(-1).values)
    assert_close("o", ours, peer, 1e-4)


def test_triton_compiles_fullgraph(poison):
    q, k, v, qi, ki, wi = make(1, 12, 12, 2, 1, 16, dtype=torch.float32, device=DEVICE)

    def f(q, k, v, qi, ki, wi):
        return dsa(q, k, v, qi, ki, wi, topk=4, backend="triton")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert_close("compiled", compiled(q, k, v, qi, ki, wi), f(q, k, v, qi, ki, wi), 1e-6)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_reference_chunk_sizes_agree(chunk):
    from lt2dsl.kernels.dsa.reference import dsa_indexer_reference, sparse_attention_reference

    q, k, v, qi, ki, wi = make(1, 30, 30, 2, 1, 8)
    idx = dsa_indexer_reference(qi, ki, wi, topk=5, chunk=chunk)
    o2, idx2 = dsa_naive(q, k, v, qi, ki, wi, topk=5)
    assert torch.equal(idx, idx2)
    assert_close("o", sparse_attention_reference(q, k, v, idx, 8**-0.5, chunk=chunk), o2, 1e-10)


def test_value_slices_of_fused_projections_are_realigned():
    """A column slice of the fused projections' output (row stride 6472, not a multiple of 16) is
    copied before a strided Triton kernel; an aligned view (a KV-cache slice) is passed as it is."""
    from lt2dsl.kernels.common.attn_utils import rows_contiguous

    out = torch.randn(2, 5, 6472)
    v = out[..., 4096:6144].unflatten(-1, (16, 128))
    assert v.stride(1) == 6472 and rows_contiguous(v).is_contiguous()
    cache = torch.randn(2, 64, 4, 128)
    view = cache[:, :5]
    assert rows_contiguous(view).data_ptr() == view.data_ptr()


def _reference_selection(keys: torch.Tensor, Tq: int, Tk: int, t0: int, topk: int) -> torch.Tensor:
    """Per chunk row: the top-k of keys[b, r, :n] by (unsigned key, lower index), as sorted sets."""
    B, C, KW = keys.shape
    u = keys.to(torch.int64) & 0xFFFFFFFF
    s = torch.arange(KW, device=keys.device)
    n = torch.clamp(t0 + torch.arange(C, device=keys.device) + (Tk - Tq) + 1, max=KW)
    k64 = torch.where(s[None, None, :] < n[None, :, None], (u << 31) + (2**31 - 1 - s), -1)
    top = k64.topk(min(topk, KW), dim=-1).values
    idx = torch.where(top >= 0, 2**31 - 1 - (top & (2**31 - 1)), -1)
    return torch.nn.functional.pad(idx, (0, topk - idx.shape[-1]), value=-1).sort(-1).values


@pytest.mark.parametrize("spread", ["wide", "narrow", "ties"])
@pytest.mark.parametrize("topk", [1, 7, 64, 200])
def test_radix_select_equals_sorted_keys(spread, topk):
    """The radix selection on synthetic 32-bit keys: spread over the whole range, sharing their top
    22 bits (the last two 8-bit passes decide), or drawn from 5 values (ties at the threshold go to the
    lower indices); rows shorter and longer than k, a chunk that starts mid-sequence."""
    from lt2dsl.kernels.dsa.triton_topk import select_topk

    g = torch.Generator().manual_seed(topk)
    B, C, Tq, Tk, t0 = 2, 12, 40, 150, 20
    KW = t0 + C + (Tk - Tq)
    if spread == "wide":
        u = torch.randint(0, 2**32, (B, C, KW), generator=g, dtype=torch.int64)
    elif spread == "narrow":
        u = 0x9ABCD000 + torch.randint(0, 2**10, (B, C, KW), generator=g, dtype=torch.int64)
    else:
        u = torch.tensor([0, 5, 2**31, 2**31 + 5, 2**32 - 1])[torch.randint(0, 5, (B, C, KW), generator=g)]
    keys = torch.where(u >= 2**31, u - 2**32, u).to(torch.int32).to(DEVICE)
    out = torch.full((B, Tq, topk), -1, dtype=torch.long, device=DEVICE)
    select_topk(keys, out, t0, Tk, topk)
    assert torch.equal(out[:, :t0], torch.full_like(out[:, :t0], -1))
    got = out[:, t0 : t0 + C]
    # index order within a row, −1 after the selected entries
    valid = got >= 0
    assert torch.equal(valid, valid.cummin(-1).values)
    assert bool((got[..., 1:] > got[..., :-1])[valid[..., 1:]].all())
    assert torch.equal(got.sort(-1).values, _reference_selection(keys, Tq, Tk, t0, topk))


def test_unordered_selection_is_the_same_set():
    """`ordered=False` (the radix selection, what `dsa` uses unless it returns the indices): each
    query's set, −1 pads included, equals the rank-ordered selection's."""
    _, _, _, qi, ki, wi = make(2, 30, 50, 1, 1, 8, HI=3, DI=16, dtype=torch.float32, device=DEVICE)
    for kk in (1, 7, 60):
        ref = dsa_indexer(qi, ki, wi, topk=kk)
        got = dsa_indexer(qi, ki, wi, topk=kk, backend="triton", ordered=False)
        assert torch.equal(got.sort(-1).values, ref.sort(-1).values), kk


@pytest.mark.parametrize("Tq,Tk", [(48, 48), (30, 50), (2, 90)])
@pytest.mark.parametrize("chunk", [16, None])
def test_triton_indexer_equals_reference(Tq, Tk, chunk):
    """Rank order (int64 keys, `torch.topk`) equal to the reference's exactly; the set (radix
    selection, index order, −1 pads last) the same sets."""
    from lt2dsl.kernels.dsa import triton_indexer

    _, _, _, qi, ki, wi = make(2, Tq, Tk, 1, 1, 8, HI=3, DI=16, dtype=torch.float32, device=DEVICE)
    for kk in (1, 5, 40, 120):
        ref = dsa_indexer(qi, ki, wi, topk=kk)
        got = triton_indexer.dsa_indexer_triton(qi, ki, wi, topk=kk, chunk=chunk)
        assert torch.equal(got, ref), (kk, chunk)
        got = triton_indexer.dsa_indexer_triton(qi, ki, wi, topk=kk, chunk=chunk, ordered=False)
        valid = got >= 0
        assert torch.equal(valid, valid.cummin(-1).values), (kk, chunk)
        assert torch.equal(got.sort(-1).values, ref.sort(-1).values), (kk, chunk)


@pytest.mark.parametrize("ordered", [True, False])
def test_indexer_ties_at_zero_go_to_the_lower_index(ordered):
    """Every index score ReLU'd to 0 but a few: the zeros tie and the lowest indices fill the rest,
    in both selections."""
    from lt2dsl.kernels.dsa import triton_indexer

    _, _, _, qi, ki, wi = make(1, 40, 40, 1, 1, 8, HI=2, DI=16, dtype=torch.float32, device=DEVICE)
    qi, ki, wi = -qi.abs(), ki.abs(), wi.abs()
    ki[:, 7] = -ki[:, 7]  # key 7 scores > 0 for every query that sees it
    for kk in (1, 6):
        ref = dsa_indexer(qi, ki, wi, topk=kk)
        got = triton_indexer.dsa_indexer_triton(qi, ki, wi, topk=kk, ordered=ordered)
        assert torch.equal(got if ordered else got.sort(-1).values, ref if ordered else ref.sort(-1).values)
