"""A decode step's RoPE with its cache writes in one launch (`lt2dsl.kernels.fused.rope_cache`):
Triton (CPU interpreter here) against the float64 reference (`naive.rope_cache_ref`) on irregular
shapes: grouped heads, partial rotation, a ring, no v, DSA's LayerNorm-ed index key written into a
`[B, L, dI]` buffer; every slot but each row's own stays as it was."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels import fused
from lt2dsl.kernels.fused import naive
from lt2dsl.kernels.fused.testing import TOL, assert_close
from lt2dsl.lowering.functional import rope_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {
    # (B, Hq, Hk, D, R, L, with v, ring, LayerNorm on k)
    "B3-q3-k1-D24-full": (3, 3, 1, 24, 24, 9, True, False, False),
    "B2-q4-k2-D20-R8-ring": (2, 4, 2, 20, 8, 5, True, True, False),
    "B3-q2-k1-D12-R6-norm-no-v": (3, 2, 1, 12, 6, 7, False, False, True),
}


def _inputs(case, dtype, g: torch.Generator) -> dict:
    B, Hq, Hk, D, R, L, with_v, ring, norm = case

    def r(*s, std=1.0):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * std).to(DEVICE)

    wide = r(B, 1, (Hq + 2 * Hk) * D + 3).to(dtype)  # q, k, v as column slices of one projection
    x = {
        "q": wide[..., 3 : 3 + Hq * D].unflatten(-1, (Hq, D)),
        "k": wide[..., 3 + Hq * D : 3 + (Hq + Hk) * D].unflatten(-1, (Hk, D)) * 2 + 0.5,
        "v": wide[..., 3 + (Hq + Hk) * D :].unflatten(-1, (Hk, D)) if with_v else None,
        "k_cache": r(B, Hk, L, D).to(dtype),
        "v_cache": r(B, Hk, L, D).to(dtype) if with_v else None,
        # positions past L wrap in the ring; below L otherwise
        "positions": torch.randint(0, 3 * L if ring else L, (B,), generator=g).to(DEVICE),
        "ring": ring,
        "norm": (r(D).float(), r(D).float(), 1e-6) if norm else None,
    }
    c, s = rope_rows(R, 10000.0, x["positions"].cpu(), torch.float32)
    return dict(x, c=c.to(DEVICE), s=s.to(DEVICE))


def _double(x: dict) -> dict:
    floats = {n for n, t in x.items() if isinstance(t, torch.Tensor) and t.is_floating_point()}
    out = {n: t.double() if n in floats else t for n, t in x.items()}
    for n in ("k_cache", "v_cache"):
        out[n] = None if x[n] is None else x[n].double().clone()
    if x["norm"] is not None:
        out["norm"] = (x["norm"][0].double(), x["norm"][1].double(), x["norm"][2])
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_rope_cache_matches_float64_reference(case, dtype):
    x = _inputs(case, dtype, torch.Generator().manual_seed(1))
    ref = _double(x)
    before = {n: None if x[n] is None else x[n].clone() for n in ("k_cache", "v_cache")}
    with torch.no_grad():
        yq = fused.rope_cache(**x, backend="triton")
    want = naive.rope_cache_ref(**ref)
    assert yq.dtype == dtype and yq.shape == x["q"].shape
    assert_close("q", yq, want, TOL[dtype])
    L = x["k_cache"].shape[2]
    slot = x["positions"] % L
    for n in ("k_cache", "v_cache"):
        if x[n] is None:
            continue
        written = torch.zeros_like(x[n], dtype=torch.bool)
        written[torch.arange(len(slot)), :, slot] = True
        assert_close(n, x[n][written], ref[n][written], TOL[dtype])
        torch.testing.assert_close(x[n][~written], before[n][~written], rtol=0, atol=0)


def test_index_key_buffer_view():
    """DSA's `[B, L, dI]` index-key buffer written through its `[B, 1, L, dI]` view."""
    x = _inputs(CASES["B3-q2-k1-D12-R6-norm-no-v"], torch.float32, torch.Generator().manual_seed(2))
    buf = x["k_cache"][:, 0].clone()  # [B, L, dI]
    ref = _double(dict(x, k_cache=buf.unsqueeze(1)))
    with torch.no_grad():
        fused.rope_cache(**dict(x, k_cache=buf.unsqueeze(1)), backend="triton")
    naive.rope_cache_ref(**ref)
    assert_close("k_idx buffer", buf, ref["k_cache"][:, 0], TOL[torch.float32])


def test_autograd_and_float64_take_the_reference():
    x = _inputs(CASES["B3-q3-k1-D24-full"], torch.float32, torch.Generator().manual_seed(3))
    x["q"] = x["q"].detach().requires_grad_(True)
    y = fused.rope_cache(**x, backend="auto")
    assert y.grad_fn is not None
    d = _double(x)
    d["q"] = d["q"].detach()
    assert fused.rope_cache(**d, backend="auto").dtype == torch.float64
