"""`gdn_decode_gates`: GDN decode with the gates formed in the recurrent kernel (GATE 3), against
the float64 two-step form (`gdn_decode_gates_ref`), at small irregular shapes under Triton's CPU
interpreter (compiled where a GPU exists): grouped value heads, head dims that are no power of two,
a and b read in place as column slices of one wider projection, the state updated in place."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.delta import gates as G
from lt2dsl.kernels.delta import ops as delta_ops
from lt2dsl.kernels.fused import triton_act
from tests.kernels.utils import DEVICE, assert_close

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def inputs(B: int, T: int, H: int, HV: int, K: int, V: int, dtype: torch.dtype, seed: int = 0) -> dict:
    """q, k (unit keys), v, and a, b as column slices of one `[B, T, 2·HV + 5]` projection output."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, std=1.0):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * std).to(DEVICE)

    proj = r(B, T, 2 * HV + 5, std=3.0).to(dtype)  # wide gate values: softplus past its threshold too
    x = {
        "q": r(B, T, H, K).to(dtype),
        "k": torch.nn.functional.normalize(r(B, T, H, K), dim=-1).to(dtype),
        "v": r(B, T, HV, V).to(dtype),
        "a": proj[..., 2 : 2 + HV],
        "b": proj[..., 3 + HV : 3 + 2 * HV],
        "A_log": r(HV, std=0.5).float(),
        "dt_bias": r(HV).float(),
        "state": r(B, HV, K, V, std=0.3).float(),
    }
    x["a"][0, 0, 0] = 30.0  # above softplus's threshold of 20: passes through
    return x


def reference(x: dict, **kw):
    """(o, final state) of the float64 two-step form."""
    y = {n: t.double() for n, t in x.items()}
    o = G.gdn_decode_gates_ref(**y, **kw)
    return o, y["state"]


@pytest.mark.parametrize(
    ("B", "T", "H", "HV", "K", "V", "dtype"),
    [
        (2, 1, 1, 3, 24, 40, torch.float32),
        (3, 3, 2, 4, 16, 20, torch.float32),
        (1, 1, 2, 2, 32, 48, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("beta_scale", [1.0, 2.0])
def test_matches_float64(B, T, H, HV, K, V, dtype, beta_scale):
    x = inputs(B, T, H, HV, K, V, dtype, seed=T + HV)
    kw = dict(beta_scale=beta_scale, scale=0.3, use_qk_l2norm_in_kernel=T > 1)
    o_ref, S_ref = reference(x, **kw)
    state = x["state"]
    with torch.no_grad():
        o = G.gdn_decode_gates(**x, backend="triton", **kw)
    assert x["state"] is state
    assert_close("o", o, o_ref, TOL[dtype])
    assert_close("state", state, S_ref, TOL[dtype])


def test_one_launch_and_the_two_step_path_agree(monkeypatch):
    """The kernel path launches one kernel and no gate kernel; the fallback (`gdn_gate` then the
    recurrence) gives the same state and output to fp32 rounding."""
    x = inputs(2, 1, 1, 2, 16, 16, torch.float32, seed=5)
    y = {n: t.clone() for n, t in x.items()}
    seen = []
    real = delta_ops.delta_recurrent_kernel

    class Spy:
        def __getitem__(self, grid):
            def run(*args, **kw):
                seen.append(kw["GATE"])
                return real[grid](*args, **kw)

            return run

    monkeypatch.setattr(delta_ops, "delta_recurrent_kernel", Spy())
    gate_runs = []
    real_gate = triton_act.gdn_gate_fwd

    def gate_spy(*a, **k):
        gate_runs.append(1)
        return real_gate(*a, **k)

    monkeypatch.setattr(triton_act, "gdn_gate_fwd", gate_spy)
    with torch.no_grad():
        o = G.gdn_decode_gates(**x, backend="triton")
        assert seen == [G.GATE_RAW] and not gate_runs
        with torch.enable_grad():  # a gradient-tracking call takes the two-step path
            o2 = G.gdn_decode_gates(**y, backend="triton")
    assert seen[-1] == 1, "the fallback runs the scalar-gate kernel"
    assert_close("o", o, o2, 1e-6)
    assert_close("state", x["state"], y["state"], 1e-6)


def test_reference_backend_float64():
    """float64 (no Triton kernel) takes the two-step path and equals the reference exactly."""
    x = {n: t.double() for n, t in inputs(1, 2, 1, 2, 8, 8, torch.float32).items()}
    y = {n: t.clone() for n, t in x.items()}
    o = G.gdn_decode_gates(**x, backend="auto")
    o_ref = G.gdn_decode_gates_ref(**y)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x["state"], y["state"], rtol=1e-12, atol=1e-12)


def test_opcheck():
    x = inputs(1, 1, 1, 2, 16, 16, torch.float32)
    args = (*(x[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state")), 1.0, 0.25, False)
    torch.library.opcheck(torch.ops.lt2dsl.gdn_recurrent_gates_inplace, args)
