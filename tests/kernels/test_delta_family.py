"""Semantics shared by the delta-rule family (DeltaNet, GDN, KDA), reference backend, float64.

Also holds the input factory and op table the per-op test files import.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from lt2dsl.kernels.delta import delta_rule, gated_delta_rule, kda
from lt2dsl.kernels.delta.chunk_ref import delta_chunk_ref
from lt2dsl.kernels.delta.configs import N_CONFIGS, forced_config
from lt2dsl.kernels.delta.naive import delta_rule_naive, gated_delta_rule_naive, kda_naive
from tests.kernels.utils import assert_close, rel_rms


@dataclass(frozen=True)
class OpInfo:
    """How to call one op of the family: its gate kind, public function and naive recurrence."""

    name: str
    gate: str  # "none" | "scalar" | "channel"
    op: object
    naive: object

    def call(self, x: dict, **kw):
        """Public op on the tensors of `make_inputs` (the gate only when the op takes one)."""
        args = (
            (x["q"], x["k"], x["v"], x["beta"])
            if self.gate == "none"
            else (x["q"], x["k"], x["v"], x["g"], x["beta"])
        )
        return self.op(*args, **kw)

    def call_naive(self, x: dict, **kw):
        args = (
            (x["q"], x["k"], x["v"], x["beta"])
            if self.gate == "none"
            else (x["q"], x["k"], x["v"], x["g"], x["beta"])
        )
        return self.naive(*args, **kw)


OPS = {
    "delta_rule": OpInfo("delta_rule", "none", delta_rule, delta_rule_naive),
    "gated_delta_rule": OpInfo("gated_delta_rule", "scalar", gated_delta_rule, gated_delta_rule_naive),
    "kda": OpInfo("kda", "channel", kda, kda_naive),
}


def make_inputs(
    gate: str,
    B: int,
    T: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    dtype=torch.float64,
    device="cpu",
    seed: int = 0,
    N: int | None = None,
    state: bool = True,
    decay: float = 1.0,
) -> dict:
    """Random inputs in the regime the layers produce: unit-norm keys, β ∈ (0, 1), log decays ≤ 0.

    `decay` scales the log decays (large values exercise the per-channel overflow path of KDA).
    The initial state has `N` rows (default B) or is None when `state` is False.
    """
    # Drawn on the target device (full-size GPU cases would take seconds on the CPU).
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64, device=device)

    x = {
        "q": rnd(B, T, H, K),
        "k": F.normalize(rnd(B, T, H, K), dim=-1),
        "v": rnd(B, T, HV, V),
        "beta": torch.rand(B, T, HV, generator=gen, dtype=torch.float64, device=device),
        "g": None,
        "initial_state": rnd(N or B, HV, K, V) * 0.5 if state else None,
    }
    if gate == "scalar":
        x["g"] = F.logsigmoid(rnd(B, T, HV) + 2.0) * decay
    elif gate == "channel":
        x["g"] = F.logsigmoid(rnd(B, T, HV, K) + 2.0) * decay
    for name, t in x.items():
        if t is not None:
            keep_fp32 = name in ("g", "initial_state") and dtype != torch.float64
            x[name] = t.to(device=device, dtype=torch.float32 if keep_fp32 else dtype)
    return x


GRAD_NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def compare_backends(
    info: OpInfo, x: dict, tol: float, grad: bool = True, reference: str = "naive", recipe=None, **kw
) -> dict[str, float]:
    """`backend="triton"` against the float64 reference on the same inputs.

    Compares o, the final state and (with `grad`) the gradient of every input for random output
    and final-state cotangents, by relative RMS error (`tests/kernels/utils.py`). `reference`
    picks the float64 truth: "naive" (token recurrence) or "chunk" (chunked form, faster on GPU);
    `recipe` the Triton kernels' forms (a `DeltaRecipe` or a name of `RECIPES`; None: the default).
    Returns each input gradient's error by input name (empty without `grad`).
    """
    ref = {n: t.detach().double().requires_grad_(grad) if t is not None else None for n, t in x.items()}
    tri = {n: t.detach().clone().requires_grad_(grad) if t is not None else None for n, t in x.items()}
    if reference == "naive":
        o_ref, S_ref = info.call_naive(ref, initial_state=ref["initial_state"], output_final_state=True, **kw)
    else:
        o_ref, S_ref = info.call(ref, initial_state=ref["initial_state"], output_final_state=True, **kw)
    kw_tri = dict(kw, backend="triton", recipe=recipe)
    o, S = info.call(tri, initial_state=tri["initial_state"], output_final_state=True, **kw_tri)
    assert o.dtype == x["v"].dtype and S.dtype == torch.float32
    assert_close("o", o, o_ref, tol)
    assert_close("final_state", S, S_ref, tol)
    if not grad:
        return {}
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)
    dS = torch.randn(S.shape, generator=gen, dtype=torch.float64).to(o.device)
    torch.autograd.backward([o_ref, S_ref], [do, dS])
    torch.autograd.backward([o, S], [do.to(o.dtype), dS.float()])
    return {n: assert_close(f"d{n}", tri[n].grad, ref[n].grad, tol) for n in GRAD_NAMES if x[n] is not None}


def tolerance(dtype: torch.dtype) -> float:
    """Relative RMS bound against float64: 1e-2 for 16-bit inputs, 1e-4 for fp32."""
    return 1e-4 if dtype == torch.float32 else 1e-2


def run_gpu_suite(info: OpInfo, case: str, dtype: torch.dtype, train: bool = True, recipe=None) -> None:
    """Full-size GPU checks shared by the per-op test files (see their `test_gpu_*`).

    Cases: "T1000-D64", "T1000-D128", "T8192-D64", "T8192-D128" (B=2, H=16), "gva" (H=8, HV=16),
    "odd" (K=V=100: a head dim that crosses a block boundary), "varlen" (lengths 1, 63, 1000,
    2000, 129). KDA's float64 chunked reference keeps a [64, 64, K] tensor per chunk for autograd,
    so at T = 8192 its gradients are not checked (forward only); T = 1000 covers them. Without
    `train` no input needs a gradient: the inference forward, which writes no chunk state.
    `recipe` picks the kernels' forms (None: each call's default recipe).
    """
    tol = tolerance(dtype)
    kw: dict = {}
    if case.startswith("T"):
        T, D = (int(p[1:]) for p in case.split("-"))
        shape = dict(B=2, T=T, H=16, HV=16, K=D, V=D)
    elif case == "gva":
        shape = dict(B=2, T=1000, H=8, HV=16, K=128, V=128)
    elif case == "odd":
        shape = dict(B=2, T=1000, H=4, HV=4, K=100, V=100)
    else:
        lens = [1, 63, 1000, 2000, 129]
        kw["cu_seqlens"] = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda")
        shape = dict(B=1, T=sum(lens), H=16, HV=16, K=128, V=128, N=len(lens))
    x = make_inputs(info.gate, dtype=dtype, device="cuda", **shape)
    grad = train and not (info.gate == "channel" and shape["T"] > 4096)
    compare_backends(info, x, tol, grad=grad, reference="chunk", recipe=recipe, **kw)


def run_gpu_decode(info: OpInfo, batch: int) -> None:
    """Decode step at full head size: T = 1, in place into the cache, against the reference."""
    x = make_inputs(info.gate, B=batch, T=1, H=16, HV=16, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    ref = {n: t.double() if t is not None else None for n, t in x.items()}
    o_ref, S_ref = info.call(ref, initial_state=ref["initial_state"], output_final_state=True)
    cache = x["initial_state"].clone()
    with torch.no_grad():
        o, S = info.call(x, initial_state=cache, inplace_final_state=True, backend="triton")
    assert S is cache
    assert_close("o", o, o_ref, 1e-2)
    assert_close("state", cache, S_ref, 1e-4)


def chunk_ref(info: OpInfo, x: dict, **kw):
    K = x["q"].shape[-1]
    return delta_chunk_ref(
        x["q"], x["k"], x["v"], x["g"], x["beta"], gate=info.gate, scale=kw.pop("scale", K**-0.5), **kw
    )


@pytest.fixture(params=list(OPS), ids=list(OPS))
def info(request) -> OpInfo:
    return OPS[request.param]


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_chunk_equals_recurrence(info, T, chunk_size):
    """The chunked WY form equals the token recurrence (outputs and final state), GVA, float64."""
    x = make_inputs(info.gate, B=2, T=T, H=2, HV=4, K=16, V=8, seed=T)
    o, S = info.call_naive(x, initial_state=x["initial_state"], output_final_state=True)
    o2, S2 = chunk_ref(
        info, x, initial_state=x["initial_state"], output_final_state=True, chunk_size=chunk_size
    )
    assert_close("o", o2, o, 1e-10)
    assert_close("final_state", S2, S, 1e-10)


def test_public_reference_equals_recurrence(info):
    """`backend="reference"` (chunk 64) with a non-default scale and no initial state."""
    x = make_inputs(info.gate, B=1, T=100, H=1, HV=3, K=8, V=8, state=False)
    o, S = info.call_naive(x, scale=0.3, output_final_state=True)
    o2, S2 = info.call(x, scale=0.3, output_final_state=True)
    assert_close("o", o2, o, 1e-10)
    assert_close("final_state", S2, S, 1e-10)
    assert info.call(x)[1] is None


def test_gradcheck_reference(info):
    """Autograd through the chunked form (chunk 4 over 7 tokens: crosses chunk boundaries)."""
    x = make_inputs(info.gate, B=1, T=7, H=1, HV=2, K=4, V=3, seed=1)
    names = [n for n in ("q", "k", "v", "g", "beta", "initial_state") if x[n] is not None]
    leaves = [x[n].clone().requires_grad_(True) for n in names]

    def f(*ts):
        y = dict(x, **dict(zip(names, ts)))
        o, S = chunk_ref(info, y, initial_state=y["initial_state"], output_final_state=True, chunk_size=4)
        return o, S

    # fast_mode checks random projections of the Jacobian: the full one costs ~10 s for KDA.
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, fast_mode=True)


def test_varlen_equals_separate(info):
    """Packed sequences with `cu_seqlens` equal running each sequence on its own."""
    lens = [1, 29, 33, 37]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    x = make_inputs(info.gate, B=1, T=sum(lens), H=2, HV=4, K=8, V=8, N=len(lens), seed=3)
    o, S = info.call(x, initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu)
    on, Sn = info.call_naive(x, initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu)
    assert_close("o vs naive varlen", o, on, 1e-10)
    assert_close("S vs naive varlen", S, Sn, 1e-10)
    for n in range(len(lens)):
        sl = slice(int(cu[n]), int(cu[n + 1]))
        y = {
            key: (t[:, sl] if t is not None and t.dim() > 2 and key != "initial_state" else t)
            for key, t in x.items()
        }
        o1, S1 = info.call(y, initial_state=x["initial_state"][n : n + 1], output_final_state=True)
        assert_close(f"o seq {n}", o[:, sl], o1, 1e-10)
        assert_close(f"S seq {n}", S[n : n + 1], S1, 1e-10)


def test_inplace_final_state(info):
    """The final state lands in `initial_state` itself, which is returned."""
    x = make_inputs(info.gate, B=2, T=5, H=1, HV=2, K=8, V=8)
    S0 = x["initial_state"].clone()
    _, S_ref = info.call(x, initial_state=S0.clone(), output_final_state=True)
    o, S = info.call(x, initial_state=x["initial_state"], inplace_final_state=True)
    assert S is x["initial_state"]
    assert_close("in-place state", S, S_ref, 1e-12)


def test_prefill_then_decode_equals_one_shot(info):
    """Chunked prefill of L tokens, then token-by-token steps, equals one call on L + 3 (§15.3)."""
    x = make_inputs(info.gate, B=2, T=70, H=2, HV=2, K=8, V=8, seed=5)
    o_all, S_all = info.call(x, initial_state=x["initial_state"], output_final_state=True)
    pre = {key: (t[:, :67] if t is not None and key != "initial_state" else t) for key, t in x.items()}
    _, S = info.call(pre, initial_state=x["initial_state"], output_final_state=True)
    for t in range(67, 70):
        step = {
            key: (u[:, t : t + 1] if u is not None and key != "initial_state" else u) for key, u in x.items()
        }
        o, S = info.call(step, initial_state=S, inplace_final_state=True)
        assert_close(f"decode step {t}", o, o_all[:, t : t + 1], 1e-10)
    assert_close("state after decode", S, S_all, 1e-10)


def test_l2norm_in_kernel(info):
    x = make_inputs(info.gate, B=1, T=9, H=2, HV=2, K=8, V=4)
    x["q"], x["k"] = x["q"] * 3, x["k"] * 0.5
    o, _ = info.call(x, use_qk_l2norm_in_kernel=True)
    y = dict(x, q=F.normalize(x["q"], dim=-1, eps=0), k=F.normalize(x["k"], dim=-1, eps=0))
    o2, _ = info.call(y)
    assert rel_rms(o, o2) < 1e-5  # eps 1e-6 inside the norm, as the peer does


def test_bad_shapes_raise(info):
    x = make_inputs(info.gate, B=1, T=4, H=2, HV=4, K=8, V=4)
    with pytest.raises(ValueError, match=r"\[B, T, HV\]"):
        info.call(dict(x, beta=x["beta"][..., :3]))
    with pytest.raises(ValueError, match="multiple"):
        info.call(dict(x, v=x["v"][:, :, :3]))
    with pytest.raises(ValueError, match=r"\[N, HV, K, V\]"):
        info.call(x, initial_state=x["initial_state"][:, :, :4])
    with pytest.raises(ValueError, match="initial_state"):
        info.call(x, inplace_final_state=True)
    with pytest.raises(ValueError, match="B == 1"):
        y = {key: (torch.cat([t, t]) if t is not None else t) for key, t in x.items()}
        info.call(y, cu_seqlens=torch.tensor([0, 4]))
    if info.gate != "none":
        with pytest.raises(ValueError, match=r"\[B, T, HV"):
            info.call(dict(x, g=x["g"][:, :, :2]))


def test_gdn_without_decay_is_deltanet():
    x = make_inputs("scalar", B=1, T=40, H=2, HV=2, K=8, V=8)
    o1, S1 = gated_delta_rule(
        x["q"],
        x["k"],
        x["v"],
        torch.zeros_like(x["g"]),
        x["beta"],
        initial_state=x["initial_state"],
        output_final_state=True,
    )
    o2, S2 = delta_rule(
        x["q"], x["k"], x["v"], x["beta"], initial_state=x["initial_state"], output_final_state=True
    )
    assert_close("o", o1, o2, 1e-12)
    assert_close("S", S1, S2, 1e-12)


def test_kda_with_uniform_channels_is_gdn():
    x = make_inputs("scalar", B=1, T=40, H=2, HV=2, K=8, V=8)
    gk = x["g"][..., None].expand(-1, -1, -1, 8).contiguous()
    o1, S1 = kda(
        x["q"], x["k"], x["v"], gk, x["beta"], initial_state=x["initial_state"], output_final_state=True
    )
    o2, S2 = gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], output_final_state=True
    )
    assert_close("o", o1, o2, 1e-12)
    assert_close("S", S1, S2, 1e-12)


GPU_CASES = ["T1000-D64", "T1000-D128", "T8192-D64", "T8192-D128", "gva", "odd", "varlen"]


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_matches_reference(info, case, dtype):
    """Full sizes on the GPU: o, final state and every gradient against float64."""
    run_gpu_suite(info, case, dtype)


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", ["T1000-D64", "T8192-D128", "gva", "odd", "varlen"])
def test_gpu_inference_matches_reference(info, case, dtype):
    """Full sizes on the GPU without gradients: o and final state against float64."""
    run_gpu_suite(info, case, dtype, train=False)


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", ["T1000-D128", "varlen"])
@pytest.mark.parametrize("name", ["fused", "split"])
def test_gpu_recipe_forms(info, name, case, dtype):
    """Each named recipe's forms at full size, whichever the default picks at this shape."""
    if info.gate == "channel" and name == "fused":
        pytest.skip("KDA's per-channel gate has no fused scan")
    run_gpu_suite(info, case, dtype, recipe=name)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_gpu_decode(info, batch):
    run_gpu_decode(info, batch)


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("config", range(N_CONFIGS))
def test_gpu_every_autotune_config(info, config, dtype):
    """Each config an autotuned kernel may pick on this GPU, forced one at a time.

    A config that does not fit the GPU (OutOfResources) is never picked by the autotuner: skipped.
    """
    with forced_config(config):
        try:
            run_gpu_suite(info, "T1000-D128", dtype)
        except OutOfResources as e:
            pytest.skip(f"config {config} does not fit: {e}")
