"""Triton kernels of the delta-rule family at small irregular shapes, in every recipe's forms.

On the CPU they run under Triton's interpreter (TRITON_INTERPRET=1, set by conftest); where a GPU
exists the same cases run compiled on it. Every case compares outputs, final states and all input
gradients with the float64 recurrence, with each buffer the kernels write filled with NaN first.
The full-size checks are `test_delta_family`'s `gpu` tests.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lt2dsl.kernels.delta import configs, launch_bwd
from lt2dsl.kernels.delta import launch as delta_launch
from lt2dsl.kernels.delta.ops import chunk_flops
from lt2dsl.kernels.delta.recipe import RECIPES, DeltaRecipe
from tests.kernels.test_delta_family import OPS, OpInfo, compare_backends, make_inputs
from tests.kernels.utils import assert_close

FP32_TOL, BF16_TOL = 1e-4, 1e-2
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# the named recipes with a form of their own: the scan forming the output, or scan and output apart
FORMS = ["fused", "split"]


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setenv("LT2_POISON", "1")


@pytest.fixture(params=list(OPS), ids=list(OPS))
def info(request) -> OpInfo:
    return OPS[request.param]


def recipe_for(info: OpInfo, name: str) -> str:
    """`name`, unless the rule has no such form (KDA's per-channel gate has only the split one)."""
    if info.gate == "channel" and name == "fused":
        pytest.skip("KDA's per-channel gate has no fused scan")
    return name


def spy_launches(monkeypatch, seen: list, *kernels) -> None:
    """Record (kernel name, launch keywords, grid) of every launch of `kernels` in `seen`."""
    real = delta_launch.launch

    def spy(tuned, plain, grid, *args, **kw):
        if plain in kernels:
            seen.append((plain.fn.__name__ if hasattr(plain, "fn") else str(plain), kw, grid))
        return real(tuned, plain, grid, *args, **kw)

    monkeypatch.setattr(delta_launch, "launch", spy)
    monkeypatch.setattr(launch_bwd, "launch", spy)


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


@pytest.mark.parametrize("case", ["T80-gva", "odd-dims", "varlen", "bf16"])
@pytest.mark.parametrize("name", FORMS)
def test_recipe_forms(info, name, case):
    """Each forward form, and the backward after it, against float64: grouped heads over two chunks
    with K != V, head dims that are not powers of two, packed sequences, and bf16."""
    recipe = recipe_for(info, name)
    if case == "varlen":
        x = make_inputs(info.gate, B=1, T=100, H=1, HV=2, K=32, V=32, dtype=torch.float32, device=DEV, N=3)
        compare_backends(
            info, x, FP32_TOL, recipe=recipe, cu_seqlens=torch.tensor([0, 40, 41, 100], device=DEV)
        )
    elif case == "bf16":
        x = make_inputs(info.gate, B=1, T=130, H=1, HV=2, K=32, V=48, dtype=torch.bfloat16, device=DEV)
        compare_backends(info, x, BF16_TOL, recipe=recipe)
    else:
        shape = (
            dict(B=1, T=80, H=1, HV=2, K=32, V=48)
            if case == "T80-gva"
            else dict(B=1, T=40, H=1, HV=1, K=24, V=20)
        )
        x = make_inputs(info.gate, dtype=torch.float32, seed=7, **shape, device=DEV)
        compare_backends(info, x, FP32_TOL, recipe=recipe)


@pytest.mark.parametrize("name", FORMS)
def test_recipe_forms_for_inference(info, name):
    """No input needs a gradient: the fused scan writes no chunk state or U' (SAVE off), over two
    chunks and a partial one, grouped value heads, K != V, an initial and a final state; and the
    split form over packed sequences in bf16."""
    recipe = recipe_for(info, name)
    x = make_inputs(info.gate, dtype=torch.float32, seed=11, B=2, T=150, H=1, HV=2, K=32, V=48, device=DEV)
    compare_backends(info, x, FP32_TOL, grad=False, recipe=recipe)
    cu = torch.tensor([0, 5, 70, 133], device=DEV)
    x = make_inputs(info.gate, B=1, T=133, H=2, HV=2, K=32, V=32, dtype=torch.bfloat16, N=3, device=DEV)
    compare_backends(info, x, BF16_TOL, grad=False, recipe=recipe, cu_seqlens=cu)


@pytest.mark.parametrize("bk", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gradient_key_tiles(info, bk, dtype, monkeypatch):
    """The per-(K tile, chunk) gradient kernel at each key tile a recipe may give it (KDA: 32), in
    either dtype: K = 100 masks the last tile's columns, and two value heads share a key head."""
    if info.gate == "channel" and bk != 32:
        pytest.skip("KDA's gradient kernel runs the 32-wide key tile")
    from lt2dsl.kernels.delta.grad import delta_grad_k_kernel

    seen = []
    spy_launches(monkeypatch, seen, delta_grad_k_kernel)
    x = make_inputs(info.gate, dtype=dtype, seed=bk, B=1, T=100, H=1, HV=2, K=100, V=40, device=DEV)
    recipe = DeltaRecipe(fused_scan=info.gate != "channel", grad_bk=bk)
    compare_backends(info, x, FP32_TOL if dtype == torch.float32 else BF16_TOL, recipe=recipe)
    assert [(kw["BK"], grid[0]) for _, kw, grid in seen] == [(bk, -(-100 // bk))], seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gate_code_of_each_rule(info, dtype, monkeypatch):
    """The fused scan and the reverse scan compile DeltaNet without the gate code (GATE 0), the
    reverse scan on 16-bit operands for 16-bit inputs (D16); GDN and KDA run their gates, KDA's
    forward in the split form only. Gradients against float64 either way."""
    from lt2dsl.kernels.delta.scan import delta_h_fwd_kernel, delta_hot_fwd_kernel
    from lt2dsl.kernels.delta.scan_bwd import delta_dh_bwd_kernel

    seen = []
    spy_launches(monkeypatch, seen, delta_hot_fwd_kernel, delta_h_fwd_kernel, delta_dh_bwd_kernel)
    x = make_inputs(info.gate, B=1, T=100, H=1, HV=2, K=32, V=32, dtype=dtype, device=DEV, seed=3)
    compare_backends(info, x, FP32_TOL if dtype == torch.float32 else BF16_TOL)
    gid = {"none": 0, "scalar": 1, "channel": 2}[info.gate]
    scan = "delta_h_fwd_kernel" if info.gate == "channel" else "delta_hot_fwd_kernel"
    d16 = info.gate == "none" and dtype != torch.float32
    assert [(n, kw["GATE"], kw.get("D16")) for n, kw, _ in seen] == [
        (scan, gid, None),
        ("delta_dh_bwd_kernel", gid, d16),
    ], seen


@pytest.mark.parametrize("span", [1e4, -1.0], ids=["dot", "elementwise"])
@pytest.mark.parametrize("case", ["T90-gva", "varlen"])
def test_kda_diagonal_block_forms(span, case):
    """KDA's diagonal sub-chunk blocks, forward and gradients, as dots (moderate decay) or
    elementwise (strong decay): both forms on the same inputs, forced through the recipe's span."""
    kda = OPS["kda"]
    recipe = DeltaRecipe(fused_scan=False, grad_bk=32, kda_diag_span=span)
    if case == "varlen":
        cu = torch.tensor([0, 1, 40, 100], device=DEV)
        x = make_inputs(kda.gate, B=1, T=100, H=1, HV=2, K=16, V=16, dtype=torch.float32, N=3, device=DEV)
        compare_backends(kda, x, FP32_TOL, recipe=recipe, cu_seqlens=cu)
        return
    x = make_inputs(kda.gate, B=1, T=90, H=1, HV=2, K=32, V=16, dtype=torch.float32, device=DEV)
    compare_backends(kda, x, FP32_TOL, recipe=recipe)


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


@pytest.mark.parametrize("name", FORMS)
def test_autotuned_kernels_are_idempotent(info, name, monkeypatch):
    """Every kernel the GPU autotunes runs twice per launch here, as the autotuner runs it several
    times on the same buffers: a kernel that reads a buffer it writes gives NaN gradients on the
    GPU only, for the first call of each shape."""
    recipe = recipe_for(info, name)
    real = delta_launch.launch
    seen = set()

    def twice(tuned, kernel, grid, *args, **kw):
        if kernel in configs.AUTOTUNED_KERNELS:
            seen.add(kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel))
            real(tuned, kernel, grid, *args, **kw)
        return real(tuned, kernel, grid, *args, **kw)

    monkeypatch.setattr(delta_launch, "launch", twice)
    monkeypatch.setattr(launch_bwd, "launch", twice)
    x = make_inputs(info.gate, dtype=torch.float32, seed=9, B=1, T=80, H=1, HV=2, K=32, V=32, device=DEV)
    compare_backends(info, x, FP32_TOL, recipe=recipe)
    assert {"delta_dh_bwd_kernel", "delta_grad_k_kernel"} <= seen, seen


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
    kw = dict(
        initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
    )
    with torch.no_grad():
        o, S = info.call(y, backend="triton", **kw)
    o_ref, S_ref = info.call(y, **kw)
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


@pytest.mark.parametrize("name", ["default", "split"])
def test_compile_fullgraph(info, name):
    """torch.compile(fullgraph=True) traces the custom ops (fake tensors) and their autograd, with
    the recipe's fields as the ops' arguments."""
    x = make_inputs(info.gate, B=1, T=20, H=1, HV=2, K=16, V=16, dtype=torch.float32, device=DEV)
    names = [n for n in ("q", "k", "v", "g", "beta", "initial_state") if x[n] is not None]

    def f(*ts):
        y = dict(x, **dict(zip(names, ts)))
        kw = dict(initial_state=y["initial_state"], output_final_state=True, backend="triton", recipe=name)
        return info.call(y, **kw)

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


@pytest.mark.parametrize(
    "gate, save, recipe",
    [
        (2, True, (False, 32, 40.0)),
        (1, True, (True, 64, 40.0)),
        (1, False, (False, 32, 40.0)),
        (0, True, (True, 64, 40.0)),
    ],
)
def test_opcheck(gate, save, recipe):
    """Schema, fake tensors and autograd registration of the chunked op for each gate, with and
    without the saved tensors (KDA's scores are among them), and of the in-place decode op."""
    name = ("none", "scalar", "channel")[gate]
    x = make_inputs(name, B=1, T=20, H=1, HV=2, K=16, V=16, dtype=torch.float32, device=DEV)
    args = (
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        x["initial_state"],
        None,
        gate,
        0.25,
        True,
        save,
        *recipe,
    )
    torch.library.opcheck(torch.ops.lt2dsl.delta_chunk_fwd, args)
    if gate != 2:
        return
    dec = (
        *(x[n][:, :2] for n in ("q", "k", "v", "g", "beta")),
        x["initial_state"].clone(),
        None,
        2,
        0.25,
        False,
    )
    torch.library.opcheck(torch.ops.lt2dsl.delta_recurrent_inplace, dec)


def test_backend_choice():
    x = make_inputs("scalar", B=1, T=4, H=1, HV=1, K=8, V=8, device=DEV)
    with pytest.raises(ValueError, match="float64"):
        OPS["gated_delta_rule"].call(x, backend="triton")
    o, _ = OPS["gated_delta_rule"].call(x, backend="auto")  # CPU: reference
    assert o.dtype == torch.float64


def test_recipe_arguments_are_checked():
    """A recipe the kernels have no form for, an unknown name or a wrong type is refused with the
    accepted values, on either backend."""
    x = make_inputs("channel", B=1, T=4, H=1, HV=1, K=8, V=8, dtype=torch.float32, device=DEV)
    kda = OPS["kda"]
    with pytest.raises(ValueError, match="no fused scan"):
        kda.call(x, backend="triton", recipe="fused")
    with pytest.raises(ValueError, match="32-wide key tile"):
        kda.call(x, backend="triton", recipe=DeltaRecipe(fused_scan=False, grad_bk=64))
    with pytest.raises(ValueError, match="known: " + ", ".join(RECIPES)):
        kda.call(x, recipe="fastest")
    with pytest.raises(TypeError, match="DeltaRecipe"):
        kda.call(x, recipe={"fused_scan": False})
    with pytest.raises(ValueError, match=r"grad_bk must be one of \(32, 64\)"):
        DeltaRecipe(grad_bk=128)


def test_two_warp_configs_are_for_16_bit_inputs():
    """2-warp configs spill kilobytes with fp32 inputs' tf32x3 dots: the autotuner's prune drops them
    for fp32 launches (DOT_IEEE), keeps them for 16-bit ones, and never leaves a launch without a config."""
    import triton

    from lt2dsl.kernels.common.backend import config_pruner
    from lt2dsl.kernels.delta.helpers import DOT_IEEE, DOT_NATIVE

    assert any(c.num_warps == 2 for c in configs.WY_ROWS) and any(c.num_warps == 2 for c in configs.KDA_PREP)
    two, four = triton.Config({}, num_warps=2), triton.Config({}, num_warps=4)
    keep = configs.no_fp32_2warp
    assert not keep(two, {"DOT": DOT_IEEE})
    assert keep(two, {"DOT": DOT_NATIVE}) and keep(four, {"DOT": DOT_IEEE})
    prune = config_pruner(keep)
    assert prune([two, four], {}, DOT=DOT_IEEE) == [four]
    assert prune([two, four], {}, DOT=DOT_NATIVE) == [two, four]
    assert prune([two], {}, DOT=DOT_IEEE) == [two]  # a forced 2-warp config still runs
