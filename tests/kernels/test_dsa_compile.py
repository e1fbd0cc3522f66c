"""DSA's sparse-attention forward compiled for sm_90 with the GPU's Triton: why strided k, v get
copied when their row strides are not multiples of 16 elements (`attn_utils.rows_contiguous`).

Triton vectorises a gather only along rows whose stride it can prove 16-divisible. With the value
rows 6472 elements apart (a column slice of the fused projections' GEMM output) the value gather
compiles to scalar 16-bit loads. Runs in a subprocess with `--gpu-triton DIR` (`make test`); the
kernel's resources at its launch config are part of the compile check (`dsa.aot_jobs`).
"""

from __future__ import annotations

import json

from tests.kernels.gpu_triton import python_with


def global_loads(value_stride_aligned: bool) -> tuple[int, int]:
    """(all global loads, scalar 16-bit global loads) in the PTX of the bf16 forward kernel."""
    import re

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


DRIVER = """
import json
from tests.kernels.test_dsa_compile import global_loads
print(json.dumps([global_loads(True), global_loads(False)]))
"""


def test_value_gather_is_vectorised_only_with_an_aligned_row_stride(gpu_triton):
    out = python_with([gpu_triton], "-c", DRIVER, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (aligned_all, aligned_scalar), (loose_all, loose_scalar) = json.loads(out.stdout.splitlines()[-1])
    print(f"aligned: {aligned_all} global loads ({aligned_scalar} scalar); "
          f"stride 6472: {loose_all} ({loose_scalar} scalar)")  # fmt: skip
    assert aligned_scalar == 0
    assert loose_scalar > 0 and loose_all > aligned_all
