"""Compile DSA's sparse-attention forward for sm_90 (H200) without a GPU and read its loads.

Why strided kernels get k, v copied when their strides are not multiples of 16 elements
(`attn_utils.rows_contiguous`):
Triton vectorises a gather only along rows whose stride it can prove 16-divisible. With the value
rows 6472 elements apart (a column slice of the fused projections' GEMM output) the value gather
compiles to scalar 16-bit loads. Runs only with LT2_AOT_CHECK=1 (it switches the interpreter off
for the kernel it imports); no device is used:

    LT2_AOT_CHECK=1 TRITON_DEFAULT_FP_FUSION=1 python -m pytest -q tests/kernels/test_dsa_compile.py
"""

from __future__ import annotations

import os
import re

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("LT2_AOT_CHECK") != "1", reason="offline sm_90 compile check: set LT2_AOT_CHECK=1"
)


def _global_loads(value_stride_aligned: bool) -> tuple[int, int]:
    """(all global loads, scalar 16-bit global loads) in the PTX of the bf16 forward kernel."""
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lt2dsl.kernels.dsa.triton_attn import _sparse_fwd_kernel as fn

    cex = dict(HQ=16, GRP=16, D=128, DV=128, BD=128, BDV=128, BR=16, BK=64, IDX_H=1, DOT_PREC="tf32")
    ints = {"Tq", "Tk", "NIDX", "NROWS", "SKB", "SKT", "SKH", "SVB", "SVT", "SVH"}
    sig = {}
    for n in fn.arg_names:
        if n in cex:
            sig[n] = "constexpr"
        elif n in ints:
            sig[n] = "i32"
        else:
            sig[n] = {"qk_scale": "fp32", "IDX": "*i32", "LSE": "*fp32"}.get(n, "*bf16")
    # as the JIT specialises: pointers and 16-divisible integers
    div = [n for n in fn.arg_names if sig[n].startswith("*")] + ["SKB", "SKT", "SKH", "SVB", "SVH", "NIDX"]
    if value_stride_aligned:
        div.append("SVT")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div}
    cexprs = {(fn.arg_names.index(k),): v for k, v in cex.items()}
    src = ASTSource(fn=fn, signature=sig, constexprs=cexprs, attrs=attrs)
    ptx = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2}
    ).asm["ptx"]
    return len(re.findall(r"ld\.global", ptx)), len(re.findall(r"ld\.global(?:\.[a-z0-9]+)*\.b16 ", ptx))


def test_value_gather_is_vectorised_only_with_an_aligned_row_stride():
    aligned_all, aligned_scalar = _global_loads(True)
    loose_all, loose_scalar = _global_loads(False)
    print(f"aligned: {aligned_all} global loads ({aligned_scalar} scalar); "
          f"stride 6472: {loose_all} ({loose_scalar} scalar)")  # fmt: skip
    assert aligned_scalar == 0
    assert loose_scalar > 0 and loose_all > aligned_all


def test_radix_topk_kernels_compile_without_spills():
    """The radix selection (`ordered=False`) and the 32-bit key variant of the score kernel,
    at the launch configs they use on the GPU: registers, shared memory, no stack."""
    from tests.kernels.test_delta_compile import MAX_STACK, SMEM_LIMIT, _compile

    os.environ.pop("TRITON_INTERPRET", None)
    from lt2dsl.kernels.dsa.triton_indexer import _indexer_kernel
    from lt2dsl.kernels.dsa.triton_topk import _select_kernel

    ints = {n: "i32" for n in ("t0", "Tq", "Tk", "C", "KW", "K")}
    sel = _compile(_select_kernel, {"KEYS": "*i32", "OUT": "*i64"}, ints, {"BLK": 2048}, 4, 1)
    score_cex = dict(HI=4, DI=64, BDI=64, BM=64, BN=128, HAS_W=True, DOT_PREC="tf32", U32=True)
    score = _compile(
        _indexer_kernel,
        {"QI": "*bf16", "KI": "*bf16", "WI": "*bf16", "KEYS": "*i32"},
        dict(ints, idx_scale="fp32"),
        score_cex,
        8,
        2,
    )
    for name, (smem, regs, stack) in (("select", sel), ("score-u32", score)):
        print(f"{name}: {smem} B shared, {regs} registers, {stack} B stack")
        assert smem <= SMEM_LIMIT
        assert stack <= MAX_STACK
