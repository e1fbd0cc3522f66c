"""The sparse-attention backward with dK/dV gathered by key (`sparse_attn_bwd(..., dkdv="by_key")`)
against float64 autograd of a dense masked softmax: dq, dk, dv for DSA's shared selections and NSA's
per-kv-head ones, MHA, GQA (a group of 3 too) and MQA, Tq < Tk, −1 pads, future and out-of-range
keys, a row that selects nothing, keys and whole key blocks nobody selects (dk = dv = 0), fp32 and
bf16; by_key = atomic to fp32 rounding; the inverse index against a Python loop. Kernel buffers
start as NaN (`poison`)."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.dsa.triton_attn import sparse_attn_bwd, sparse_attn_fwd
from lt2dsl.kernels.dsa.triton_attn_bykey import inverse_index
from tests.kernels.test_dsa_split import inputs, messy_selection
from tests.kernels.utils import DEVICE, assert_close, seeded_like

# keys no query may select: key 5, and keys 16 … 31 (a whole block of the kernel's 16)
UNSELECTED = [5, *range(16, 32)]


def selected(indices, Tq, Tk, HKV):
    """`[B, Tq, HKV, Tk]` bool: kv head h's query t attends to key s."""
    idx = indices.cpu()
    if idx.dim() == 3:
        idx = idx[:, :, None].expand(-1, -1, HKV, -1)
    pos = torch.arange(Tq).view(1, Tq, 1, 1) + Tk - Tq
    ok = (idx >= 0) & (idx <= pos) & (idx < Tk)
    out = torch.zeros(*idx.shape[:3], Tk + 1, dtype=torch.bool)
    return out.scatter_(3, torch.where(ok, idx, Tk), True)[..., :Tk]


def reference(do, q, k, v, indices, scale):
    """(dq, dk, dv) by float64 autograd: softmax over each row's selected keys (none: o = 0)."""
    Tq, HQ, Tk, HKV = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    q, k, v = (t.detach().double().cpu().requires_grad_() for t in (q, k, v))
    sel = selected(indices, Tq, Tk, HKV).repeat_interleave(HQ // HKV, 2).transpose(1, 2)  # [B, HQ, Tq, Tk]
    kk, vv = (t.repeat_interleave(HQ // HKV, 2) for t in (k, v))
    s = torch.einsum("bthd,bshd->bhts", q, kk) * scale
    p = torch.softmax(s.masked_fill(~sel, -1e30), -1) * sel.any(-1, keepdim=True)
    o = torch.einsum("bhts,bshd->bthd", p, vv)
    return torch.autograd.grad(o, (q, k, v), do.double().cpu())


def run(B, Tq, Tk, HQ, HKV, D, nidx, per_head, dtype=torch.float32, dkdv="by_key", seed=0):
    """(kernel grads, reference grads) on a messy selection with `UNSELECTED` dropped."""
    q, k, v = inputs(B, Tq, Tk, HQ, HKV, D, dtype=dtype, seed=seed)
    idx = messy_selection(B, Tq, Tk, nidx, HKV if per_head else None, seed=seed)
    idx = idx.masked_fill(torch.isin(idx, torch.tensor(UNSELECTED)), -1).to(DEVICE)
    scale = D**-0.5
    o, lse = sparse_attn_fwd(q, k, v, idx, scale)
    do = seeded_like(o)
    return sparse_attn_bwd(do, q, k, v, o, lse, idx, scale, dkdv=dkdv), reference(do, q, k, v, idx, scale)


CASES = {  # B, Tq, Tk, HQ, HKV, D, selection length, per kv head
    "dsa-gqa-decode-offset": (2, 6, 45, 4, 2, 16, 24, False),
    "nsa-per-head-gqa": (1, 7, 40, 4, 2, 16, 18, True),
    "dsa-mha-square": (1, 20, 36, 2, 2, 16, 12, False),
    "dsa-group-of-3": (1, 4, 37, 6, 2, 16, 20, False),
    "nsa-mqa": (1, 5, 34, 4, 1, 16, 16, True),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_by_key_matches_float64(case, poison):
    grads, want = run(*case)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
        assert_close(name, got, ref, 1e-5)
    for got in grads[1:]:
        assert got[:, UNSELECTED].eq(0).all()


def test_by_key_bf16(poison):
    grads, want = run(*CASES["dsa-gqa-decode-offset"], dtype=torch.bfloat16, seed=1)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
        assert got.dtype == torch.bfloat16
        assert_close(name, got, ref, 2e-2)


@pytest.mark.parametrize("case", ["dsa-gqa-decode-offset", "nsa-per-head-gqa"])
def test_by_key_equals_atomic(case, poison):
    by_key, _ = run(*CASES[case], dkdv="by_key", seed=2)
    atomic, _ = run(*CASES[case], dkdv="atomic", seed=2)
    for name, a, b in zip(("dq", "dk", "dv"), by_key, atomic):
        assert_close(name, a, b, 1e-6)


@pytest.mark.parametrize("block", [1, 4, 16])
@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per-head"])
def test_inverse_index_matches_a_loop(block, per_head):
    B, Tq, Tk, H, nidx = 2, 5, 21, 3, 9
    idx = messy_selection(B, Tq, Tk, nidx, H if per_head else None, seed=3)
    offsets, queries, masks = (t.cpu() for t in inverse_index(idx.to(DEVICE), Tq, Tk, block))
    H = H if per_head else 1
    nb = -(-Tk // block)
    want: dict[int, dict[int, int]] = {}
    for b in range(B):
        for t in range(Tq):
            for h in range(H):
                for s in (idx[b, t, h] if per_head else idx[b, t]).tolist():
                    if 0 <= s <= t + Tk - Tq and s < Tk:
                        lists = want.setdefault((b * H + h) * nb + s // block, {})
                        lists[t] = lists.get(t, 0) | 1 << (s % block)
    assert offsets.shape == (B * H * nb + 1,) and offsets[0] == 0
    assert offsets[-1] == sum(len(v) for v in want.values())
    for g in range(B * H * nb):
        lo, hi = offsets[g].item(), offsets[g + 1].item()
        got = list(zip(queries[lo:hi].tolist(), masks[lo:hi].tolist()))
        assert got == sorted(want.get(g, {}).items()), g


def test_unknown_dkdv_raises():
    with pytest.raises(ValueError, match="'atomic', 'by_key'"):
        sparse_attn_bwd(None, None, None, None, None, None, None, 1.0, dkdv="bykey")


def test_auto_gathers_by_key_for_groups_up_to_eight():
    from lt2dsl.kernels.dsa.triton_attn import resolve_dkdv

    assert [resolve_dkdv("auto", g) for g in (1, 8, 16)] == ["by_key", "by_key", "atomic"]
    assert [resolve_dkdv(m, 1) for m in ("atomic", "by_key")] == ["atomic", "by_key"]
    with pytest.raises(ValueError, match="'auto'"):
        resolve_dkdv("fastest", 4)


def test_the_ops_backward_takes_the_default_form(monkeypatch):
    """`lt2dsl::dsa_attn_fwd`'s autograd backward (what a model runs) sums dk, dv the way
    `DEFAULT_DKDV` names: by_key gives atomic's gradients, each form really runs, and "auto" (the
    default) gathers by key for a group of two query heads per kv head."""
    from lt2dsl.kernels.dsa import triton_attn as A
    from lt2dsl.kernels.dsa.ops import dsa_attn_fwd_op

    q, k, v = inputs(1, 6, 20, 4, 2, 16, seed=4)
    idx = messy_selection(1, 6, 20, 8, seed=4).to(DEVICE)
    grads, calls = {}, []
    by_key = A.dkdv_by_key
    monkeypatch.setattr(A, "dkdv_by_key", lambda *args: calls.append(1) or by_key(*args))
    assert A.DEFAULT_DKDV == "auto" and q.shape[2] // k.shape[2] == 2  # a group of 2: by key
    for form in ("atomic", "by_key", "auto"):
        monkeypatch.setattr(A, "DEFAULT_DKDV", form)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = dsa_attn_fwd_op(*leaves, idx, 0.25)[0]
        (o * torch.linspace(-1, 1, o.shape[-1], device=o.device)).sum().backward()
        grads[form] = [t.grad for t in leaves]
    assert len(calls) == 2
    for name, a, b in zip(("dq", "dk", "dv"), grads["by_key"], grads["atomic"]):
        assert_close(name, a, b, 1e-6)
