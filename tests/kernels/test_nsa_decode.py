"""NSA's Triton decode step (`kernels.nsa.triton_decode`, CPU interpreter here) against the dense
masked reference of the engine (`engine.sparse.nsa_rows`, float64): rows at different positions of
one buffer (before the first compressed block completes, inside the first selection block, deep
in), the peer's geometry (l = d = l' = 8) and a general one (l = 8, d = 4, l' = 16), five blocks
chosen of which three are forced, a group of 3 query heads on
each of 2 kv heads, odd head dims, with and without a window; the chosen blocks are the reference's."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.engine.sparse import nsa_rows
from lt2dsl.kernels.nsa.common import NSAGeometry
from lt2dsl.kernels.nsa.triton_decode import nsa_decode_triton
from tests.kernels.utils import DEVICE, assert_close, rel_rms

L, HQ, HKV, D, DV = 96, 6, 2, 24, 20
POSITIONS = [3, 17, 50, 95]
GEOMETRIES = {
    "peer": dict(block=8, cmp_block=8, stride=8),
    "general": dict(block=16, cmp_block=8, stride=4),
}


def inputs(geo: dict, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B = len(POSITIONS)
    NC = NSAGeometry.make(geo["block"], geo["cmp_block"], geo["stride"]).n_cmp(L)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(DEVICE, dtype)

    q = r(B, 1, HQ, D, scale=2.0)
    k, v = r(B, L, HKV, D), r(B, L, HKV, DV)
    # the compressed buffers as the cache keeps them: [B, HKV, NC, d] seen through a transpose
    kc, vc = r(B, HKV, NC, D).transpose(1, 2), r(B, HKV, NC, DV).transpose(1, 2)
    gates = torch.sigmoid(r(B, 1, HQ, 3))
    t = torch.tensor(POSITIONS, device=DEVICE)
    return q, k, v, gates, kc, vc, t


def reference_blocks(q, kc, vc, t, geometry: dict) -> list[set[int]]:
    """The reference's chosen blocks per (row, kv head), from `nsa_rows`'s own helper."""
    from lt2dsl.engine.sparse import _choose
    from lt2dsl.kernels.common.attn_utils import repeat_kv
    from lt2dsl.kernels.nsa.reference import masked_attention

    geo = NSAGeometry.make(geometry["block"], geometry["cmp_block"], geometry["stride"])
    G = HQ // HKV
    qc = q.double() * D**-0.5
    pos = t[:, None, None, None]
    ends = torch.arange(kc.shape[1], device=q.device) * geo.stride + geo.cmp - 1
    _, p_cmp = masked_attention(qc, repeat_kv(kc.double(), G), repeat_kv(vc.double(), G), ends <= pos)
    chosen = _choose(p_cmp, pos, geo, geo.n_sel(L), geometry["select"], G)  # [B, HKV, 1, nsb]
    return [{int(j) for j in chosen[b, h, 0].nonzero()} for b in range(len(POSITIONS)) for h in range(HKV)]


@pytest.mark.parametrize("splits", [1, 3], ids=["one-kernel", "split"])
@pytest.mark.parametrize("window", [0, 24])
@pytest.mark.parametrize("geo", list(GEOMETRIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_decode_step_matches_the_dense_reference(geo, window, dtype, splits):
    """The compressed branch in one kernel, and split in whole tiles (16 keys under the
    interpreter), the blocks chosen in slices of 4 and the splits merged per head by the combine
    kernel: the general geometry's 23 compressed keys in splits of 16 and 7 (a row that sees 3
    leaves the second empty, one that sees none both), the peer's 12 in one."""
    geometry = dict(GEOMETRIES[geo], select=5, window=window)
    q, k, v, gates, kc, vc, t = inputs(GEOMETRIES[geo], dtype)
    got, idx = nsa_decode_triton(q, k, v, gates, kc, vc, t, geometry, return_indices=True, splits=splits)
    want = nsa_rows(*(x.double() for x in (q, k, v, gates, kc, vc)), t, geometry)
    assert got.shape == (len(POSITIONS), 1, HQ, DV) and got.dtype == dtype
    assert_close("o", got.double(), want, 2e-5 if dtype == torch.float32 else 2e-2)
    sel = GEOMETRIES[geo]["block"]
    n_slc = 5 * sel
    assert idx.shape == (len(POSITIONS), 1, HKV, n_slc + window)
    # the window's slots t − w + 1 … t follow the chosen blocks' tokens, −1 before slot 0
    for b, tb in enumerate(POSITIONS):
        want_w = [j if j >= 0 else -1 for j in range(tb - window + 1, tb + 1)]
        assert all(row[n_slc:] == want_w for row in idx[b, 0].tolist())
    if dtype == torch.float32:
        rows = idx[..., :n_slc].reshape(-1, n_slc)
        blocks = [{int(i) // sel for i in row.tolist() if i >= 0} for row in rows]
        assert blocks == reference_blocks(q, kc, vc, t, geometry)
        # every selected token is at or before the row's position, and none repeats
        for b, rows in enumerate(idx[:, 0, :, :n_slc].tolist()):
            for row in rows:
                toks = [i for i in row if i >= 0]
                assert len(set(toks)) == len(toks) and all(i <= POSITIONS[b] for i in toks)


@pytest.mark.parametrize("geo", list(GEOMETRIES))
def test_split_form_slices_choose_as_one_slice(geo):
    """The split form scores and ranks the selection blocks in slices of 1, 2, 4 and 16 blocks
    (12 and 6 blocks here: up to 12 slices, slices with fewer choosable blocks than the 5 chosen,
    rows with fewer than 5 in all): the same index rows, in order, and the same output as one
    slice of every block (the same kept scores, so the same keys), and the reference's blocks."""
    geometry = dict(GEOMETRIES[geo], select=5, window=8)
    q, k, v, gates, kc, vc, t = inputs(GEOMETRIES[geo], torch.float32, seed=3)
    run = lambda n: nsa_decode_triton(q, k, v, gates, kc, vc, t, geometry, return_indices=True,  # noqa: E731
                                      splits=2, slice_blocks=n)  # fmt: skip
    one_o, one_idx = run(16)
    for n in (1, 2, 4):
        o, idx = run(n)
        assert torch.equal(idx, one_idx), f"slices of {n} blocks"
        assert torch.equal(o, one_o), f"slices of {n} blocks"
    n_slc = 5 * GEOMETRIES[geo]["block"]
    rows = one_idx[..., :n_slc].reshape(-1, n_slc)
    blocks = [{int(i) // GEOMETRIES[geo]["block"] for i in row.tolist() if i >= 0} for row in rows]
    assert blocks == reference_blocks(q, kc, vc, t, geometry)


def test_gate_logits_take_their_sigmoid_in_the_kernel():
    """The engine passes the gates' logits (`nsa_attend` takes them): the combine kernel's sigmoid
    gives what the reference gives with the sigmoids."""
    geometry = dict(GEOMETRIES["general"], select=5, window=24)
    q, k, v, gates, kc, vc, t = inputs(GEOMETRIES["general"], torch.float32)
    logits = torch.logit(gates)
    got = nsa_decode_triton(q, k, v, logits, kc, vc, t, geometry, gate_logits=True)
    want = nsa_rows(*(x.double() for x in (q, k, v, gates, kc, vc)), t, geometry)
    assert_close("o", got.double(), want, 2e-5)


def _prefilled(x, buf, t: int, row: int, cmp_block: int, stride: int, phi: tuple):
    """The compressed buffer of row `row` as a prefill of t tokens leaves it: every complete block."""
    from lt2dsl.lowering.functional_sparse import compress_blocks, n_blocks

    n = n_blocks(t, cmp_block, stride)
    if n:
        blocks = x[row : row + 1, :t].unfold(1, cmp_block, stride)[:, :n].transpose(-1, -2)
        buf[row : row + 1, :, :n] = compress_blocks(blocks, *phi).transpose(1, 2).to(buf.dtype)


@pytest.mark.parametrize("mlp", [False, True], ids=["mean", "mlp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compress_step_writes_the_blocks_a_step_completes(mlp, dtype):
    """Rows whose new token completes a block (t + 1 = 8, 12, 40 with l = 8, d = 4), one that
    completes none (t = 13) and one before the first block (t = 5): after a prefill of t tokens
    and the step, the buffer is what `engine.sparse.compress_rows` leaves (its writes of blocks
    no step completes, and of a partial block 0, change nothing a query sees); the keys' and the
    values' buffers in one launch."""
    from lt2dsl.engine.sparse import compress_rows
    from lt2dsl.kernels.nsa.triton_decode import compress_step

    g = torch.Generator().manual_seed(3)
    t = torch.tensor([7, 11, 39, 13, 5], device=DEVICE)
    B, l, d, HKV, Lb = len(t), 8, 20, 2, 48
    NC = (Lb - l) // 4 + 1

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64).to(DEVICE, dtype)

    x = r(B, Lb, HKV, d)
    phi = (r(l, d), r(d, l * d) / (l * d) ** 0.5, r(d)) if mlp else ()

    def prefilled(xx, ph, dt):
        buf = torch.zeros(B, HKV, NC, d, device=DEVICE, dtype=dt)
        for row, tb in enumerate(t.tolist()):
            _prefilled(xx, buf, tb, row, l, 4, ph)
        return buf

    # the float64 truth, and the reference path's own result in the kernel's dtype
    truth = prefilled(x.double(), tuple(p.double() for p in phi), torch.float64)
    compress_rows(truth, x.double(), t, l, 4, tuple(p.double() for p in phi))
    want = prefilled(x, phi, dtype)
    got = want.clone()
    compress_rows(want, x, t, l, 4, phi)
    # the values' buffer compressed in the same launch from x reversed along the channels
    xv = x.flip(-1).contiguous()
    got_v = prefilled(xv, phi, dtype)
    want_v = got_v.clone()
    compress_rows(want_v, xv, t, l, 4, phi)
    phi3 = phi if mlp else (None, None, None)
    out, out_v = compress_step((got, got_v), (x, xv), t, l, 4, (phi3, phi3))
    assert (
        out.shape == (B, NC, HKV, d)
        and out.data_ptr() == got.data_ptr()
        and out_v.data_ptr() == got_v.data_ptr()
    )
    tol_v = 1e-5 if dtype == torch.float32 else 1e-2
    for row in range(B):
        n = max(0, (t[row].item() + 1 - l) // 4 + 1)
        if n:
            assert_close(f"v row {row}", got_v[row, :, :n], want_v[row, :, :n], tol_v)
        assert torch.equal(got_v[row, :, n:], torch.zeros_like(got_v[row, :, n:]))
    n_seen = [max(0, (tb + 1 - l) // 4 + 1) for tb in t.tolist()]  # blocks a query at t_b may see
    for row, n in enumerate(n_seen):
        if n:
            # no farther from the truth than the reference path in the same dtype (its rounding)
            bound = 1.5 * rel_rms(want[row, :, :n], truth[row, :, :n]) + 1e-6
            assert_close(f"row {row}", got[row, :, :n], truth[row, :, :n], bound)
        assert torch.equal(got[row, :, n:], torch.zeros_like(got[row, :, n:])), "wrote a block no query sees"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "splits, Lb, slices",
    [(1, 4096, None), (4, 4096, None), (4, 4096, 8), (None, 32768, None)],
    ids=["one-kernel", "split", "split-8-slices", "32k-own-rule"],
)
def test_gpu_example_geometry_matches_the_reference(splits, Lb, slices):
    """`examples/lt2_sparse_nsa.lt2`'s geometry (l' = 64, l = 32, d = 16, 16 blocks, window 512, 16
    query heads on one kv head of 128) over a 4096-slot buffer, rows at 40, 1000 and 4095, fp32:
    the same blocks and output as the dense reference; the split form with one slice of 64 blocks
    and with 8 slices of 8; and over 32,768 slots (rows at 40, 20,000, 32,767) with the kernel's own
    splits and slices (8 slices of 64 blocks)."""
    geometry = dict(block=64, cmp_block=32, stride=16, select=16, window=512)
    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, d = 3, 16, 128
    NC = NSAGeometry.make(64, 32, 16).n_cmp(Lb)

    def r(*s):
        return torch.randn(*s, generator=g, device="cuda")

    q, k, v = r(B, 1, H, d) * 2, r(B, Lb, 1, d), r(B, Lb, 1, d)
    kc, vc = r(B, 1, NC, d).transpose(1, 2), r(B, 1, NC, d).transpose(1, 2)
    gates = torch.sigmoid(r(B, 1, H, 3))
    t = torch.tensor([40, 1000 if Lb == 4096 else 20_000, Lb - 1], device="cuda")
    got, idx = nsa_decode_triton(q, k, v, gates, kc, vc, t, geometry, return_indices=True, splits=splits,
                                 slice_blocks=slices)  # fmt: skip
    want = nsa_rows(*(x.double() for x in (q, k, v, gates, kc, vc)), t, geometry)
    assert_close("o", got.double(), want, 1e-4)
    blocks = [{int(i) // 64 for i in row.tolist() if i >= 0} for row in idx[..., : 16 * 64].reshape(B, -1)]
    from lt2dsl.engine.sparse import _choose
    from lt2dsl.kernels.nsa.reference import masked_attention

    pos = t[:, None, None, None]
    ends = torch.arange(NC, device="cuda") * 16 + 31
    kx, vx = (x.double().repeat_interleave(H, 2) for x in (kc, vc))
    _, p_cmp = masked_attention(q.double() * d**-0.5, kx, vx, ends <= pos)
    chosen = _choose(p_cmp, pos, NSAGeometry.make(64, 32, 16), Lb // 64, 16, H)
    assert blocks == [{int(j) for j in chosen[b, 0, 0].nonzero()} for b in range(B)]
