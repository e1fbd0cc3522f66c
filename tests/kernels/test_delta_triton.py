"""Triton kernels of the delta-rule family at small irregular shapes.

On the CPU they run under Triton's interpreter (TRITON_INTERPRET=1, set by conftest); where a GPU
exists the same cases run compiled on it. Every case compares outputs, final states and all input
gradients with the float64 recurrence, with each buffer the kernels write filled with NaN first.
The full-size checks are the per-op files' `gpu` tests.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import lt2dsl.kernels.delta.launch as delta_launch
from lt2dsl.kernels.delta.ops import chunk_flops
from tests.kernels.test_delta_family import OPS, OpInfo, compare_backends, make_inputs
from tests.kernels.utils import assert_close

FP32_TOL, BF16_TOL = 1e-4, 1e-2
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(delta_launch, "POISON", True)


@pytest.fixture(params=list(OPS), ids=list(OPS))
def info(request) -> OpInfo:
    return OPS[request.param]


@pytest.mark.parametrize(
    "shape",
    [
        dict(B=2, T=63, H=1, HV=2, K=32, V=32),  # grouped value heads, one partial chunk
        dict(B=1, T=100, H=2, HV=2, K=16, V=32),  # two chunks, K < V
        dict(B=1, T=40, H=1, HV=1, K=24, V=20),  # head dims that are not powers of two
    ],
    ids=["T63-gva", "T100", "odd-dims"],
)
def test_chunked_forward_backward(info, shape):
    x = make_inputs(info.gate, dtype=torch.float32, seed=shape["T"], **shape, device=DEV)
    compare_backends(info, x, FP32_TOL)


# Backward forms other than the default, by the `delta_launch` switch each sets: the fused reverse
# scan (LT2_DELTA_WBWD=0), the W-based one with the state gradient transposed (LT2_DELTA_TSTATE_BWD=1;
# KDA's per-channel gate keeps the other scan), Y = Tᵀ dU' formed by the C x C kernel
# (LT2_DELTA_Y_IN_CC=1; every rule), the reverse scan's 16-bit dots (LT2_DELTA_BWD16=1)
BACKWARD_FORMS = {
    "fused-scan": ("WBWD", False),
    "transposed-scan": ("TSTATE_BWD", True),
    "y-in-cc": ("Y_IN_CC", True),
    # the W-based reverse scan on 16-bit operands (bf16 case) and DeltaNet's without the gate code
    # for every rule ("1"; DeltaNet's default), and for none ("0": DeltaNet on the gate code, b = 0)
    "bwd16": ("BWD16", "1"),
    "bwd-tf32": ("BWD16", "0"),
    # Y = Tᵀ dU' formed in the reverse scan (LT2_DELTA_Y_IN_SCAN=1); the backward's scratch in 16
    # bits (LT2_DELTA_BWD_LP=1), the C x C matrices too (=2), and with Y formed elsewhere (bf16 case)
    "y-in-scan": ("Y_IN_SCAN", True),
    "scratch-16bit": ("BWD_LP", 1),
    "scratch-16bit-cc": ("BWD_LP", 2),
    "y-in-scan-16bit": (("Y_IN_SCAN", True), ("BWD_LP", 1)),
    "y-in-cc-16bit": (("Y_IN_CC", True), ("BWD_LP", 2)),
    # Pᵀ dO formed in the reverse scan (LT2_DELTA_DU0_IN_SCAN=1), alone and with Y there too
    "du0-in-scan": ("DU0_IN_SCAN", True),
    "du0-y-in-scan-16bit": (("DU0_IN_SCAN", True), ("Y_IN_SCAN", True), ("BWD_LP", 1)),
}


@pytest.mark.parametrize("case", ["T63-gva", "odd-dims", "varlen", "bf16"])
@pytest.mark.parametrize("form", list(BACKWARD_FORMS))
def test_backward_forms(info, form, case, monkeypatch):
    """Each backward form against float64 on the shapes of the default one, and in bf16."""
    switches = BACKWARD_FORMS[form]
    for name, value in switches if isinstance(switches[0], tuple) else (switches,):
        monkeypatch.setattr(delta_launch, name, value)
    if case == "varlen":
        x = make_inputs(info.gate, B=1, T=100, H=1, HV=2, K=32, V=32, dtype=torch.float32, device=DEV, N=3)
        compare_backends(info, x, FP32_TOL, cu_seqlens=torch.tensor([0, 40, 41, 100], device=DEV))
    elif case == "bf16":
        x = make_inputs(info.gate, B=1, T=130, H=1, HV=2, K=32, V=48, dtype=torch.bfloat16, device=DEV)
        compare_backends(info, x, BF16_TOL)
    else:
        shape = (
            dict(B=2, T=63, H=1, HV=2, K=32, V=32)
            if case == "T63-gva"
            else dict(B=1, T=40, H=1, HV=1, K=24, V=20)
        )
        x = make_inputs(info.gate, dtype=torch.float32, seed=shape["T"], **shape, device=DEV)
        compare_backends(info, x, FP32_TOL)


# KDA kernel layouts: (LT2_KDA_SPLIT, LT2_KDA_GRAD_SPLIT) — the preparation as one kernel or its
# two halves (the default), the intra-chunk gradients as one kernel or two launches (staged)
KDA_LAYOUTS = {"one-kernel": ("0", "0"), "split": ("1", "0"), "split-gradsplit": ("1", "1")}


@pytest.mark.parametrize("layout", list(KDA_LAYOUTS))
@pytest.mark.parametrize("form", ["dot", "elementwise"])
@pytest.mark.parametrize("case", ["T90-gva", "varlen"])
def test_kda_diagonal_block_forms(form, case, layout, monkeypatch):
    """KDA's diagonal sub-chunk blocks, forward and gradients, as dots (moderate decay) or
    elementwise (strong decay): both forms on the same inputs, forced through the span limit, in
    every kernel layout (`KDA_LAYOUTS`)."""
    prep, grad = KDA_LAYOUTS[layout]
    monkeypatch.setenv("LT2_KDA_SPLIT", prep)
    monkeypatch.setenv("LT2_KDA_GRAD_SPLIT", grad)
    monkeypatch.setattr(delta_launch, "KDA_DIAG_SPAN", 1e4 if form == "dot" else -1.0)
    kda = OPS["kda"]
    if case == "varlen":
        cu = torch.tensor([0, 1, 40, 100], device=DEV)
        x = make_inputs(kda.gate, B=1, T=100, H=1, HV=2, K=16, V=16, dtype=torch.float32, N=3, device=DEV)
        compare_backends(kda, x, FP32_TOL, cu_seqlens=cu)
        return
    x = make_inputs(kda.gate, B=1, T=90, H=1, HV=2, K=32, V=16, dtype=torch.float32, device=DEV)
    compare_backends(kda, x, FP32_TOL)


@pytest.mark.parametrize("span", [1e4, -1.0], ids=["dot", "elementwise"])
def test_kda_split_preparation_is_bit_identical(span, monkeypatch):
    """The two halves of KDA's preparation (Aqk; gcum and T) compute what the single kernel does,
    to the bit, partial chunks and grouped value heads included."""
    from lt2dsl.kernels.delta.launch import ChunkMeta, kda_prep_fwd

    monkeypatch.setattr(delta_launch, "KDA_DIAG_SPAN", span)
    x = make_inputs(OPS["kda"].gate, B=2, T=90, H=1, HV=2, K=48, V=16, dtype=torch.bfloat16, device=DEV)
    meta = ChunkMeta(2, 90, 2, None)
    outs = []
    for split in ("0", "1"):
        monkeypatch.setenv("LT2_KDA_SPLIT", split)
        outs.append(kda_prep_fwd(x["q"], x["k"], x["g"], x["beta"], 0.125, meta))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kda_16bit_dots(dtype, monkeypatch):
    """With LT2_DELTA_BF16_DOTS the dots take 16-bit operands: fp16 holds e^11 at most, so the
    diagonal blocks' dot form stops at e^8 there (decays here straddle that limit)."""
    monkeypatch.setattr(delta_launch, "BF16_DOTS", True)
    kda = OPS["kda"]
    x = make_inputs(kda.gate, B=1, T=90, H=1, HV=2, K=32, V=16, dtype=dtype, decay=4.0, device=DEV)
    compare_backends(kda, x, 2 * BF16_TOL if dtype == torch.bfloat16 else BF16_TOL)


def test_kda_mixed_decay_forms():
    """Strong decay in some sub-chunks and channel slices only: one call takes both diagonal forms."""
    kda = OPS["kda"]
    x = make_inputs(kda.gate, B=1, T=100, H=1, HV=1, K=32, V=16, dtype=torch.float32, device=DEV)
    g = x["g"].clone()
    g[:, 20:40, :, :16] *= 30.0
    x["g"] = g
    compare_backends(kda, x, FP32_TOL)


def test_no_initial_state_and_scale(info):
    x = make_inputs(info.gate, B=1, T=70, H=1, HV=1, K=16, V=16, dtype=torch.float32, state=False, device=DEV)
    compare_backends(info, x, FP32_TOL, scale=0.7)


def test_varlen(info):
    """Packed sequences of lengths 1, 39, 60 (chunks never cross a sequence boundary)."""
    cu = torch.tensor([0, 1, 40, 100], device=DEV)
    x = make_inputs(info.gate, B=1, T=100, H=1, HV=2, K=16, V=16, dtype=torch.float32, N=3, device=DEV)
    compare_backends(info, x, FP32_TOL, cu_seqlens=cu)


@pytest.mark.parametrize(
    "fused, tstate, early_p",
    [(False, False, 0), (True, False, 0), (None, True, 0), (True, True, 0), (True, True, 1)],
    ids=["split-o", "fused-o", "default", "fused-o-transposed", "fused-o-transposed-early-p"],
)
@pytest.mark.parametrize("wu", [False, True], ids=["scan-T", "wu"])
def test_forward_variants(info, wu, fused, tstate, early_p, monkeypatch):
    """Every training forward form against float64, grouped heads and two chunks, forward and
    gradients: the scan applying T itself (default) or W, U formed first (LT2_DELTA_WU), each with
    the output in its own kernel (LT2_DELTA_FUSED_O=0, and =inference, as these calls train) or
    formed in the scan (=1, the default), untransposed (LT2_DELTA_TSTATE=0) or with the state
    transposed (and in its EARLY_P order)."""
    monkeypatch.setattr(delta_launch, "WU", wu)
    monkeypatch.setattr(delta_launch, "FUSED_O", fused)
    monkeypatch.setattr(delta_launch, "TSTATE", tstate)
    monkeypatch.setattr(delta_launch, "HOT_EARLY_P", early_p)
    x = make_inputs(info.gate, dtype=torch.float32, seed=7, B=1, T=80, H=1, HV=2, K=32, V=48, device=DEV)
    compare_backends(info, x, FP32_TOL)


@pytest.mark.parametrize(
    "fused, tstate",
    [(False, False), (None, False), (None, True)],
    ids=["split-o", "inference", "inference-transposed"],
)
def test_forward_variants_inference_varlen(info, fused, tstate, monkeypatch):
    """Inference with the split form (LT2_DELTA_FUSED_O=0) and with the output formed in the scan
    (=inference, or the default =1: no state or U' buffer), untransposed (LT2_DELTA_TSTATE=0) or with
    the state transposed (the default), over packed sequences with an initial state, bf16: the
    same output and final state as float64."""
    monkeypatch.setattr(delta_launch, "FUSED_O", fused)
    monkeypatch.setattr(delta_launch, "TSTATE", tstate)
    cu = torch.tensor([0, 5, 70, 133], device=DEV)
    x = make_inputs(info.gate, B=1, T=133, H=2, HV=2, K=32, V=32, dtype=torch.bfloat16, N=3, device=DEV)
    compare_backends(info, x, BF16_TOL, grad=False, cu_seqlens=cu)


@pytest.mark.parametrize(
    "scan", ["split", "fused", "transposed", "transposed-bwd", "y-in-cc", "y-in-scan", "du0-in-scan"]
)
@pytest.mark.parametrize("wbwd", [False, True], ids=["fused-bwd", "w-bwd"])
def test_autotuned_kernels_are_idempotent(info, wbwd, scan, monkeypatch):
    """Every kernel the GPU autotunes runs twice per launch here, as the autotuner runs it several
    times on the same buffers: a kernel that reads a buffer it writes (the first split backward's
    in-place Y = Tᵀ dU') gives NaN gradients on the GPU only, for the first call of each shape.
    `scan`: the forward scan and output apart, fused, fused with the state transposed (and the
    reverse scan too), or Y formed in the C x C kernel."""
    monkeypatch.setattr(delta_launch, "WBWD", wbwd)
    monkeypatch.setattr(delta_launch, "FUSED_O", scan != "split")
    monkeypatch.setattr(delta_launch, "TSTATE", scan.startswith("transposed"))
    monkeypatch.setattr(delta_launch, "TSTATE_BWD", scan == "transposed-bwd")
    monkeypatch.setattr(delta_launch, "Y_IN_CC", scan == "y-in-cc")
    monkeypatch.setattr(delta_launch, "Y_IN_SCAN", scan == "y-in-scan")
    monkeypatch.setattr(delta_launch, "DU0_IN_SCAN", scan == "du0-in-scan")
    plain = delta_launch.launch
    seen = set()

    def twice(tuned, kernel, grid, *args, **kw):
        if kernel in delta_launch.AUTOTUNED_KERNELS:
            seen.add(kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel))
            plain(tuned, kernel, grid, *args, **kw)
        return plain(tuned, kernel, grid, *args, **kw)

    monkeypatch.setattr(delta_launch, "launch", twice)
    x = make_inputs(info.gate, dtype=torch.float32, seed=9, B=1, T=80, H=1, HV=2, K=32, V=32, device=DEV)
    compare_backends(info, x, FP32_TOL)
    assert seen, "no autotuned kernel was launched"


def test_bf16(info):
    x = make_inputs(info.gate, B=1, T=63, H=1, HV=2, K=32, V=32, dtype=torch.bfloat16, device=DEV)
    compare_backends(info, x, BF16_TOL)


# an overflow under the interpreter is an inf/NaN intermediate the GPU would compute silently
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("op", ["gated_delta_rule", "kda"])
def test_strong_decay(op):
    """Log decays down to ≈ −60 a step: the per-channel products must stay inside fp32."""
    x = make_inputs(
        OPS[op].gate, B=1, T=100, H=1, HV=1, K=32, V=16, dtype=torch.float32, decay=30.0, device=DEV
    )
    compare_backends(OPS[op], x, FP32_TOL)


def test_decode_kernel(info):
    """Short inference calls take the token-recurrent kernel: T = 1 and 3, varlen, q/k L2 norm."""
    for T in (1, 3):
        x = make_inputs(info.gate, B=3, T=T, H=1, HV=2, K=16, V=32, dtype=torch.float32, seed=T, device=DEV)
        compare_backends(info, x, FP32_TOL, grad=False)
    cu = torch.tensor([0, 1, 3, 7], device=DEV)
    x = make_inputs(info.gate, B=1, T=7, H=2, HV=2, K=16, V=16, dtype=torch.float32, N=3, device=DEV)
    compare_backends(info, x, FP32_TOL, grad=False, cu_seqlens=cu)
    y = dict(x, q=x["q"] * 3, k=x["k"] * 0.5)
    with torch.no_grad():
        o, S = info.call(
            y,
            initial_state=x["initial_state"],
            output_final_state=True,
            cu_seqlens=cu,
            use_qk_l2norm_in_kernel=True,
            backend="triton",
        )
    o_ref, S_ref = info.call(
        y,
        initial_state=x["initial_state"],
        output_final_state=True,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
    )
    assert_close("o (l2norm)", o, o_ref, FP32_TOL)
    assert_close("S (l2norm)", S, S_ref, FP32_TOL)


def test_decode_in_place(info):
    """`inplace_final_state` writes into the cache tensor itself, step after step."""
    x = make_inputs(info.gate, B=2, T=4, H=1, HV=2, K=16, V=16, dtype=torch.float32, device=DEV)
    o_all, S_all = info.call(x, initial_state=x["initial_state"], output_final_state=True)
    cache = x["initial_state"].clone()
    with torch.no_grad():
        for t in range(4):
            step = {
                n: (u[:, t : t + 1] if u is not None and n != "initial_state" else u) for n, u in x.items()
            }
            o, S = info.call(step, initial_state=cache, inplace_final_state=True, backend="triton")
            assert S is cache
            assert_close(f"o step {t}", o, o_all[:, t : t + 1], FP32_TOL)
    assert_close("cache", cache, S_all, FP32_TOL)


def test_compile_fullgraph(info):
    """torch.compile(fullgraph=True) traces the custom ops (fake tensors) and their autograd."""
    x = make_inputs(info.gate, B=1, T=20, H=1, HV=2, K=16, V=16, dtype=torch.float32, device=DEV)
    names = [n for n in ("q", "k", "v", "g", "beta", "initial_state") if x[n] is not None]

    def f(*ts):
        y = dict(x, **dict(zip(names, ts)))
        o, S = info.call(y, initial_state=y["initial_state"], output_final_state=True, backend="triton")
        return o, S

    eager = [x[n].clone().requires_grad_(True) for n in names]
    comp = [x[n].clone().requires_grad_(True) for n in names]
    o1, S1 = f(*eager)
    o2, S2 = torch.compile(f, fullgraph=True, backend="aot_eager")(*comp)
    (o1.sum() + S1.square().sum()).backward()
    (o2.sum() + S2.square().sum()).backward()
    assert_close("o", o2, o1, 1e-6)
    for n, a, b in zip(names, comp, eager):
        assert_close(f"d{n}", a.grad, b.grad, 1e-6)


def test_flop_counter_counts_the_ops():
    x = make_inputs("scalar", B=1, T=40, H=1, HV=2, K=16, V=8, dtype=torch.float32, device=DEV)
    leaves = {n: t.requires_grad_(True) for n, t in x.items()}
    with FlopCounterMode(display=False) as fc:
        o, _ = OPS["gated_delta_rule"].call(leaves, initial_state=x["initial_state"], backend="triton")
    fwd = chunk_flops(1, 40, 2, 16, 8)
    assert fc.get_total_flops() == fwd
    with FlopCounterMode(display=False) as fc:
        o.sum().backward()
    assert fc.get_total_flops() > 2 * fwd


def test_opcheck():
    """Schema, fake tensors and autograd registration of the chunked and decode ops."""
    x = make_inputs("channel", B=1, T=20, H=1, HV=2, K=16, V=16, dtype=torch.float32, device=DEV)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], None, 2, 0.25, True, True)
    torch.library.opcheck(torch.ops.lt2dsl.delta_chunk_fwd, args)
    dec = (
        x["q"][:, :2],
        x["k"][:, :2],
        x["v"][:, :2],
        x["g"][:, :2],
        x["beta"][:, :2],
        x["initial_state"].clone(),
        None,
        2,
        0.25,
        False,
    )
    torch.library.opcheck(torch.ops.lt2dsl.delta_recurrent_inplace, dec)


@pytest.mark.parametrize("wbwd,save", [(False, True), (True, True), (False, False)])
def test_opcheck_scalar_gate_forms(wbwd, save, monkeypatch):
    """The chunked op's fake outputs match the real ones in every backward form: whether the scores
    P are kept depends on it (the fused reverse scan reads them, the W-based one does not)."""
    monkeypatch.setattr(delta_launch, "WBWD", wbwd)
    x = make_inputs("scalar", B=1, T=20, H=1, HV=2, K=16, V=16, dtype=torch.float32, device=DEV)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], None, 1, 0.25, True, save)
    torch.library.opcheck(torch.ops.lt2dsl.delta_chunk_fwd, args)


def test_backend_choice():
    x = make_inputs("scalar", B=1, T=4, H=1, HV=1, K=8, V=8, device=DEV)
    with pytest.raises(ValueError, match="float64"):
        OPS["gated_delta_rule"].call(x, backend="triton")
    o, _ = OPS["gated_delta_rule"].call(x, backend="auto")  # CPU: reference
    assert o.dtype == torch.float64


def test_two_warp_configs_are_for_16_bit_inputs():
    """2-warp configs spill kilobytes with fp32 inputs' FMA dots: the autotuner's prune drops them for
    fp32 launches (DOT_IEEE), keeps them for 16-bit ones, and never leaves a launch without a config."""
    import triton

    from lt2dsl.kernels.delta.helpers import DOT_IEEE, DOT_NATIVE

    assert any(c.num_warps == 2 for c in delta_launch._WY_ROWS_CONFIGS)
    two, four = triton.Config({}, num_warps=2), triton.Config({}, num_warps=4)
    keep = delta_launch._no_fp32_2warp
    assert not keep(two, {"DOT": DOT_IEEE})
    assert keep(two, {"DOT": DOT_NATIVE}) and keep(four, {"DOT": DOT_IEEE})

    from lt2dsl.kernels.common.backend import config_pruner

    prune = config_pruner(keep)
    assert prune([two, four], {}, DOT=DOT_IEEE) == [four]
    assert prune([two, four], {}, DOT=DOT_NATIVE) == [two, four]
    assert prune([two], {}, DOT=DOT_IEEE) == [two]  # a forced 2-warp config still runs


def test_narrow_kda_preparation_configs():
    """KDA's preparation below 4 warps: 2 warps for either split half of 16-bit inputs, 1 warp for
    the Aqk half only (the other spills at 1 warp offline), never for the single kernel or fp32."""
    import triton

    from lt2dsl.kernels.delta.helpers import DOT_IEEE, DOT_NATIVE

    keep = delta_launch._kda_narrow
    one, two, four = (triton.Config({"BK": 16}, num_warps=w) for w in (1, 2, 4))
    for part in (0, 1, 2):
        assert keep(four, {"DOT": DOT_IEEE, "PART": part})
        assert not keep(two, {"DOT": DOT_IEEE, "PART": part})
        assert keep(two, {"DOT": DOT_NATIVE, "PART": part}) == (part != 0)
        assert keep(one, {"DOT": DOT_NATIVE, "PART": part}) == (part == 1)


def test_kda_launch_switches(monkeypatch):
    """The KDA switches read at each call: the two-half preparation by default, the single gradient
    kernel at its fixed tiles unless told otherwise."""
    for name in ("LT2_KDA_SPLIT", "LT2_KDA_GRAD", "LT2_KDA_GRAD_SPLIT"):
        monkeypatch.delenv(name, raising=False)
    assert delta_launch.kda_split() and not delta_launch.kda_grad_split()
    assert delta_launch.kda_grad_tiles() == (delta_launch.KDA_BK, delta_launch.KDA_WARPS)
    monkeypatch.setenv("LT2_KDA_SPLIT", "0")
    monkeypatch.setenv("LT2_KDA_GRAD", "64,8")
    monkeypatch.setenv("LT2_KDA_GRAD_SPLIT", "1")
    assert not delta_launch.kda_split() and delta_launch.kda_grad_split()
    assert delta_launch.kda_grad_tiles() == (64, 8)


@pytest.mark.parametrize(
    "tstate, early_p", [(False, 0), (True, 0), (True, 1)], ids=["untransposed", "transposed", "early-p"]
)
@pytest.mark.parametrize("wu", [False, True], ids=["scan-T", "wu"])
def test_inference_fused_scan(info, wu, tstate, early_p, monkeypatch):
    """The fused inference scan in fp32 against float64 (no input needs a gradient): two chunks and
    a partial one, grouped value heads, K != V, an initial state and the final state; the
    transposed scan also in its EARLY_P order (a candidate config on the GPU)."""
    monkeypatch.setattr(delta_launch, "WU", wu)
    monkeypatch.setattr(delta_launch, "FUSED_O", None)
    monkeypatch.setattr(delta_launch, "TSTATE", tstate)
    monkeypatch.setattr(delta_launch, "HOT_EARLY_P", early_p)
    x = make_inputs(info.gate, dtype=torch.float32, seed=11, B=2, T=150, H=1, HV=2, K=32, V=48, device=DEV)
    compare_backends(info, x, FP32_TOL, grad=False)


@pytest.mark.parametrize("nogate", [True, False], ids=["gate-free", "b0"])
def test_deltanet_scan_gate_code(nogate, monkeypatch):
    """DeltaNet's transposed fused scan compiles without the gate (GATE 0) by default and with the
    scalar-gate code on b = 0 under LT2_DELTA_NOGATE=0; both against float64, fp32, with gradients."""
    from lt2dsl.kernels.delta import scan as delta_split

    monkeypatch.setattr(delta_launch, "NOGATE", nogate)
    gates = []
    real = delta_launch.launch

    def spy(tuned, plain, *args, **kw):
        if plain is delta_split.delta_hot_fwd_kernel:
            gates.append(kw["GATE"])
        return real(tuned, plain, *args, **kw)

    monkeypatch.setattr(delta_launch, "launch", spy)
    info = OPS["delta_rule"]
    x = make_inputs(info.gate, dtype=torch.float32, seed=16, B=2, T=150, H=1, HV=2, K=32, V=48, device=DEV)
    compare_backends(info, x, FP32_TOL)
    assert gates and set(gates) == {0 if nogate else 1}, gates


def test_fused_output_switch():
    """LT2_DELTA_FUSED_O: 0 (split), 1 (always fused, the default), inference (fused without
    gradients); anything else is refused with the accepted values."""
    assert delta_launch.FUSED_O is True or "LT2_DELTA_FUSED_O" in os.environ
    assert delta_launch._fused_o_switch("0") is False
    assert delta_launch._fused_o_switch("1") is True
    assert delta_launch._fused_o_switch("inference") is None
    with pytest.raises(ValueError, match="expected one of 1, 0, inference"):
        delta_launch._fused_o_switch("yes")


@pytest.mark.parametrize("bk", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gradient_key_tiles(info, bk, dtype, monkeypatch):
    """The per-(K tile, chunk) gradient kernel at every key tile it may run with (LT2_DELTA_GRAD_BK;
    fp32 inputs and KDA run 32 on the GPU, forced here to the same tile so the folded accumulators
    are checked at fp32 precision too): K = 100 masks the last tile's columns, and two value heads
    share a key head. Gradients against float64."""
    monkeypatch.setattr(delta_launch, "GRAD_BK", bk)
    monkeypatch.setattr(delta_launch, "FP32_GRAD_BK", bk)
    from lt2dsl.kernels.delta.grad import delta_grad_k_kernel

    seen = []
    real = delta_launch.launch

    def spy(tuned, plain, grid, *args, **kw):
        if plain is delta_grad_k_kernel:
            seen.append((kw["BK"], grid[0]))
        return real(tuned, plain, grid, *args, **kw)

    monkeypatch.setattr(delta_launch, "launch", spy)
    x = make_inputs(info.gate, dtype=dtype, seed=bk, B=1, T=100, H=1, HV=2, K=100, V=40, device=DEV)
    compare_backends(info, x, FP32_TOL if dtype == torch.float32 else BF16_TOL)
    assert seen == [(bk, -(-100 // bk))], seen


@pytest.mark.parametrize("sms", [1, 1000], ids=["few-sms", "many-sms"])
def test_gated_scan_splits_when_it_cannot_fill_the_gpu(info, sms, monkeypatch):
    """With fewer (value tile, sequence x head) programs than half the SMs the gated fused scan
    gives way to the split form (state scan, then the chunk-parallel output kernel); DeltaNet's
    gate-free scan and KDA's per-channel one are unaffected. Both forms against float64."""
    from lt2dsl.kernels.delta import scan as delta_split

    monkeypatch.setattr(delta_launch, "sm_count", lambda device: sms)
    used = set()
    real = delta_launch.launch

    def spy(tuned, plain, *args, **kw):
        for name in ("delta_hot_fwd_kernel", "delta_h_fwd_kernel"):
            if plain is getattr(delta_split, name):
                used.add(name)
        return real(tuned, plain, *args, **kw)

    monkeypatch.setattr(delta_launch, "launch", spy)
    x = make_inputs(info.gate, dtype=torch.float32, seed=5, B=1, T=80, H=1, HV=2, K=32, V=48, device=DEV)
    compare_backends(info, x, FP32_TOL)
    if info.gate == "channel":
        assert used == {"delta_h_fwd_kernel"}, used
    elif info.gate == "none" or sms == 1:
        assert used == {"delta_hot_fwd_kernel"}, used
    else:
        assert used == {"delta_h_fwd_kernel"}, used


def test_gated_scan_fill_rule():
    assert delta_launch.gated_scan_fills(128, 132)
    assert not delta_launch.gated_scan_fills(32, 132)
    assert delta_launch.gated_scan_fills(1, None)  # the interpreter: no SM count, the fused scan


@pytest.mark.parametrize("mode", ["none", "1", "0"])
def test_reverse_scan_16bit_switch(info, mode, monkeypatch):
    """LT2_DELTA_BWD16: the W-based reverse scan's 16-bit dots and, for DeltaNet, the gate-free code
    are on for DeltaNet only by default ("none"), for every rule with "1", for none with "0"; bf16
    gradients against float64 each way. Anything else is refused."""
    from lt2dsl.kernels.delta import scan as delta_split

    monkeypatch.setattr(delta_launch, "BWD16", mode)
    seen = []
    real = delta_launch.launch

    def spy(tuned, plain, *args, **kw):
        if plain is delta_split.delta_dh_bwd_kernel:
            seen.append((kw["GATE"], kw.get("D16", False)))
        return real(tuned, plain, *args, **kw)

    monkeypatch.setattr(delta_launch, "launch", spy)
    x = make_inputs(info.gate, B=1, T=100, H=1, HV=2, K=32, V=32, dtype=torch.bfloat16, device=DEV, seed=3)
    compare_backends(info, x, BF16_TOL)
    on = mode == "1" or (mode == "none" and info.gate == "none")
    gid = {"none": 0, "scalar": 1, "channel": 2}[info.gate]
    # DeltaNet's scan takes the scalar-gate code on b = 0 unless the switch is on
    assert seen == [(gid if on else max(gid, 1), on)], seen
    assert delta_launch._bwd16_switch(mode) == mode
    with pytest.raises(ValueError, match="expected one of none, 1, 0"):
        delta_launch._bwd16_switch("yes")


@pytest.mark.parametrize("lp", [0, 1, 2])
def test_backward_scratch_dtypes(info, lp, monkeypatch):
    """LT2_DELTA_BWD_LP: with 16-bit inputs, DeltaNet's and GDN's backward keeps Pᵀ dO, dU' and Y
    in the input dtype with 1, the C x C kernel's two matrices too with 2, everything fp32 with 0
    (the default); KDA's scratch stays fp32. bf16 gradients against float64 each way, and 1's
    within 1.5x of the fp32 scratch's (the interpreter rounds as the GPU does: dv and dβ rise most,
    2.4-2.8e-3 -> 3.2-4.0e-3 here; dq and dk by under 15%)."""
    from lt2dsl.kernels.delta.grad import delta_grad_cc_kernel
    from lt2dsl.kernels.delta.scan import delta_du0_kernel, delta_y_kernel

    seen = {}
    real = delta_launch.launch

    def spy(tuned, plain, grid, *args, **kw):
        if plain is delta_du0_kernel:
            seen["du0"] = args[5].dtype
        elif plain is delta_y_kernel:
            seen["Y"] = args[2].dtype
        elif plain is delta_grad_cc_kernel:
            seen["MA"] = args[11].dtype
        return real(tuned, plain, grid, *args, **kw)

    monkeypatch.setattr(delta_launch, "launch", spy)
    x = make_inputs(info.gate, B=1, T=150, H=1, HV=2, K=32, V=48, dtype=torch.bfloat16, device=DEV, seed=4)
    errs = {}
    for mode in (0, lp):
        monkeypatch.setattr(delta_launch, "BWD_LP", mode)
        seen.clear()
        errs[mode] = compare_backends(info, x, BF16_TOL)
        scratch = torch.bfloat16 if mode >= 1 and info.gate != "channel" else torch.float32
        matrices = torch.bfloat16 if mode == 2 and info.gate != "channel" else torch.float32
        assert seen == {"du0": scratch, "Y": scratch, "MA": matrices}, seen
    if lp == 1:
        for n, e in errs[1].items():
            assert e <= 1.5 * errs[0][n], (n, errs)
    assert delta_launch._bwd_lp_switch(str(lp)) == lp
    with pytest.raises(ValueError, match="expected one of 0, 1, 2"):
        delta_launch._bwd_lp_switch("on")
