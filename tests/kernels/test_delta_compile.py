"""Compile the delta-rule kernels for sm_90 (H200) without a GPU, and check their resources.

The CPU interpreter accepts code the compiler rejects, and cannot tell whether a kernel fits:
this test runs Triton's real pipeline (down to a cubin with the bundled ptxas) for every kernel at
its autotune configs, then asserts shared memory within Hopper's 227 KiB per block, register
spills small (`cuobjdump --dump-resource-usage`) and no pipelining race in the TTGIR
(`ttgir_checks.pipeline_hazards`; the other compile tests share `_compile`). It takes about two
minutes, so it runs only with LT2_AOT_CHECK=1, in its own pytest process (it switches the
interpreter off for the kernels it imports); no device is used:

    LT2_AOT_CHECK=1 TRITON_DEFAULT_FP_FUSION=1 python -m pytest -q tests/kernels/test_delta_compile.py
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import pytest

from bench.ttgir_checks import pipeline_hazards

pytestmark = pytest.mark.skipif(
    os.environ.get("LT2_AOT_CHECK") != "1", reason="offline sm_90 compile check: set LT2_AOT_CHECK=1"
)

SMEM_LIMIT = 232448  # bytes of shared memory per block on sm_90
MAX_STACK = 512  # bytes of per-thread stack (spills) tolerated for bf16 configs


def _compile(
    fn, ptr_types: dict, scalars: dict, constexprs: dict, num_warps: int, num_stages: int, aligned=("T", "R")
):
    """(shared bytes, registers, stack bytes) of `fn` compiled for sm_90 with these constexprs;
    the integer arguments named in `aligned` compile as divisible by 16."""
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = scalars.get(name, ptr_types.get(name, "*fp32"))
    # As the JIT specialises 16-byte aligned pointers and integers divisible by 16.
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if sig[n].startswith("*") or n in aligned
    }
    cex = {(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    src = ASTSource(fn=fn, signature=sig, constexprs=cex, attrs=attrs)
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    hazards = pipeline_hazards(kernel.asm["ttgir"])
    assert not hazards, (
        f"{fn.__name__} at {num_warps} warps, {num_stages} stages: single-buffered operands of "
        f"asynchronous dots with dots left pending (the ninth session's race): {hazards}"
    )
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True)
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", out.stdout)
    return kernel.metadata.shared, int(m.group(1)), int(m.group(2))


def _jobs():
    """(id, kernel, pointer dtypes, scalars, constexprs, warps, stages) at K = V = 128, bf16."""
    if os.environ.get("LT2_AOT_CHECK") != "1":
        return []
    os.environ.pop("TRITON_INTERPRET", None)
    import triton.language as tl

    from lt2dsl.kernels.common import delta_launch as L
    from lt2dsl.kernels.common.delta_grad import (
        delta_grad_cc_kernel,
        delta_grad_final_kernel,
        delta_grad_k_kernel,
    )
    from lt2dsl.kernels.common.delta_recurrent import delta_recurrent_kernel
    from lt2dsl.kernels.common.delta_split import (
        delta_dh_bwd_kernel,
        delta_dht_bwd_kernel,
        delta_du0_kernel,
        delta_h_fwd_kernel,
        delta_ho_fwd_kernel,
        delta_hot_fwd_kernel,
        delta_o_fwd_kernel,
        delta_wu_fwd_kernel,
        delta_y_kernel,
    )
    from lt2dsl.kernels.common.delta_state import delta_state_bwd_kernel
    from lt2dsl.kernels.common.delta_wy import delta_qk_fwd_kernel, delta_wy_rows_kernel
    from lt2dsl.kernels.kda.chunk_grad import kda_grad_intra_kernel
    from lt2dsl.kernels.kda.chunk_intra import kda_intra_fwd_kernel

    P, D = "*bf16", 128
    ptr = {n: P for n in ("q", "k", "v", "beta", "o", "h", "vnew", "do", "dv", "dh", "w", "u")}
    ptr.update(cu_seqlens="*i64", chunk_indices="*i32", chunk_offsets="*i32")
    # DeltaNet's and GDN's backward scratch in 16 bits (LT2_DELTA_BWD_LP: 1 the per-token tensors,
    # the default; 2 the C x C matrices too); KDA's stays fp32
    lp1 = dict(ptr, du0=P, du=P, Y=P)
    lp2 = dict(lp1, MA=P, MB=P)
    sc = {"T": "i32", "R": "i32", "NC": "i32", "scale": "fp32"}
    base = dict(H=16, HV=16, K=D, BT=64, IS_VARLEN=False)
    jobs = []
    for gate in (0, 1):
        cfg = L._PREP_CONFIGS[0]
        cex = dict(base, BK=D, USE_G=bool(gate), DOT=0)
        jobs.append((f"qk-g{gate}", delta_qk_fwd_kernel, ptr, sc, cex, cfg.num_warps, cfg.num_stages))
        for i, rcfg in enumerate(L._WY_ROWS_CONFIGS):
            jobs.append((f"wy_rows-g{gate}-c{i}", delta_wy_rows_kernel, ptr, sc, cex, rcfg.num_warps, 1))
    for gate in (0, 1, 2):
        # DeltaNet's state scans run the scalar-gate code (GATE 1): no GATE 0 state-scan job
        for i, cfg in enumerate(L._STATE_CONFIGS if gate else []):
            bwd = dict(
                base, V=D, BK=D, GATE=gate, USE_DHT=True, STORE_DH0=True, DOT=0, PREC=True, **cfg.kwargs
            )
            jobs.append(
                (
                    f"state_bwd-g{gate}-c{i}",
                    delta_state_bwd_kernel,
                    ptr,
                    sc,
                    bwd,
                    cfg.num_warps,
                    cfg.num_stages,
                )
            )
        for i, cfg in enumerate(L._H_CONFIGS if gate else []):
            for wu in (True, False):
                cex = dict(base, V=D, BK=D, GATE=gate, USE_H0=True, STORE_FINAL=True, STORE_VNEW=not wu,
                           DOT=0, PREC=True, WU=wu, **cfg.kwargs)  # fmt: skip
                jobs.append((f"h_fwd-g{gate}-wu{wu:d}-c{i}", delta_h_fwd_kernel, ptr, sc, cex, cfg.num_warps,
                             cfg.num_stages))  # fmt: skip
        for i, cfg in enumerate(L._HO_CONFIGS if gate == 1 else []):
            for wu, save in ((False, False), (False, True), (True, True)):
                cex = dict(base, V=D, BK=D, GATE=gate, USE_H0=True, STORE_FINAL=True, SAVE=save, DOT=0,
                           PREC=True, WU=wu, **cfg.kwargs)  # fmt: skip
                jobs.append((f"ho_fwd-g{gate}-wu{wu:d}-save{save:d}-c{i}", delta_ho_fwd_kernel, ptr, sc, cex,
                             cfg.num_warps, cfg.num_stages))  # fmt: skip
        # GATE 0 is DeltaNet's transposed fused scan (no gate code)
        for i, cfg in enumerate(L._HOT_CONFIGS if gate <= 1 else []):
            for wu, save in ((False, False), (False, True), (True, True)):
                cex = dict(base, V=D, BK=D, GATE=gate, USE_H0=True, STORE_FINAL=True, SAVE=save, DOT=0,
                           PREC=True, WU=wu, **{"EARLY_P": 0, **cfg.kwargs})  # fmt: skip
                name = f"hot_fwd-g{gate}-wu{wu:d}-save{save:d}-c{i}"
                jobs.append((name, delta_hot_fwd_kernel, ptr, sc, cex, cfg.num_warps, cfg.num_stages))
        for i, cfg in enumerate(L._HOT_CONFIGS[:4] if gate == 1 else []):
            cex = dict(
                base, V=D, BK=D, GATE=gate, USE_DHT=True, STORE_DH0=True, DOT=0, PREC=True, **cfg.kwargs
            )
            name = f"dht_bwd-g{gate}-c{i}"
            jobs.append((name, delta_dht_bwd_kernel, ptr, sc, cex, cfg.num_warps, cfg.num_stages))
        for i, cfg in enumerate(L._WU_CONFIGS if gate else []):
            cex = dict(base, V=D, BK=D, GATE=gate, DOT=0, PREC=True, **cfg.kwargs)
            jobs.append(
                (f"wu-g{gate}-c{i}", delta_wu_fwd_kernel, ptr, sc, cex, cfg.num_warps, cfg.num_stages)
            )
        # the backward's scratch: fp32 (the default, "lp0") and for DeltaNet and GDN 16-bit
        # (LT2_DELTA_BWD_LP=1, "lp1"); KDA's is always fp32
        scratches = {"lp0": ptr, "lp1": lp1} if gate < 2 else {"lp0": ptr}
        # (D16, FORM_Y, FORM_DU0, scratch) as `state_bwd` may run them: D16 (LT2_DELTA_BWD16) is
        # DeltaNet's default and GDN's opt-in, never KDA's; Y = Tᵀ dU' (LT2_DELTA_Y_IN_SCAN) and
        # Pᵀ dO (LT2_DELTA_DU0_IN_SCAN) formed in the scan for DeltaNet and GDN (not in GDN's 16-bit
        # one), compiled with the 16-bit scratch they are timed with
        forms = {
            0: [(True, False, False, "lp0"), *[(True, y, u, "lp1") for y in (0, 1) for u in (0, 1)]],
            1: [(False, False, False, "lp0"), (True, False, False, "lp0"), (False, False, False, "lp1"),
                (False, True, False, "lp1"), (False, False, True, "lp1")],
            2: [(False, False, False, "lp0")],
        }[gate]  # fmt: skip
        for d16, form_y, form_du0, lp in forms:
            for i, cfg in enumerate(L._DHW_CONFIGS):
                cex = dict(base, V=D, BK=D, GATE=gate, USE_DHT=True, STORE_DH0=True, DOT=0, PREC=True,
                           D16=d16, FORM_Y=form_y, FORM_DU0=form_du0, **cfg.kwargs)  # fmt: skip
                name = f"dhw_bwd{'16' if d16 else ''}-g{gate}-y{form_y:d}-u{form_du0:d}-{lp}-c{i}"
                jobs.append(
                    (name, delta_dh_bwd_kernel, scratches[lp], sc, cex, cfg.num_warps, cfg.num_stages)
                )
        for lp, ptrs in scratches.items() if gate else ():
            for i, cfg in enumerate(L._DU0_CONFIGS):
                # the Y pass is gate-free: compiled once per scratch dtype (gate 1's loop)
                if gate == 1:
                    # dv is written by this pass with the 16-bit scratch, by the C x C kernel with fp32
                    cex = dict(HV=16, V=D, BT=64, IS_VARLEN=False, DOT=0, PREC=True, DT=tl.bfloat16,
                               STORE_DV=lp != "lp0", **cfg.kwargs)  # fmt: skip
                    name = f"y-{lp}-c{i}"
                    jobs.append((name, delta_y_kernel, ptrs, sc, cex, cfg.num_warps, cfg.num_stages))
                cex = dict(base, V=D, BK=D, GATE=gate, DOT=0, PREC=True, **cfg.kwargs)
                jobs.append(
                    (f"du0-g{gate}-{lp}-c{i}", delta_du0_kernel, ptrs, sc, cex, cfg.num_warps, cfg.num_stages)
                )
        for i, cfg in enumerate(L._O_CONFIGS if gate else []):
            cex = dict(base, V=D, BK=D, GATE=gate, DOT=0, PREC=True, **cfg.kwargs)
            jobs.append(
                (f"o_fwd-g{gate}-c{i}", delta_o_fwd_kernel, ptr, sc, cex, cfg.num_warps, cfg.num_stages)
            )
        # each scratch dtype, and for DeltaNet and GDN the C x C matrices in 16 bits too (BWD_LP 2)
        cc_scratches = {**scratches, "lp2": lp2} if gate < 2 else scratches
        for i, cfg in enumerate(L._CC_CONFIGS):
            for form_y in (False, True):
                for lp, ptrs in cc_scratches.items():
                    # dv comes from the pass that forms a 16-bit Y (`delta_y_kernel`), else from
                    # this kernel
                    store_dv = form_y or lp == "lp0"
                    cex = dict(base, V=D, BK=D, GATE=gate, DOT=0, PREC=True, FORM_Y=form_y, STORE_DV=store_dv,
                               **cfg.kwargs)  # fmt: skip
                    name = f"grad_cc-g{gate}-y{form_y:d}-{lp}-c{i}"
                    jobs.append((name, delta_grad_cc_kernel, ptrs, sc, cex, cfg.num_warps, cfg.num_stages))
        # KDA (GATE 2) runs the 32-wide key tile only (`delta_launch.grad_bk`)
        tiles = L._GRAD_CONFIGS_BY_BK.items() if gate < 2 else [(L.FP32_GRAD_BK, L._GRAD_CONFIGS_BY_BK[32])]
        for bk, cfgs in tiles:
            # the 16-bit scratch at the default and the 128-wide tile (both timed), and BWD_LP 2
            # (the C x C matrices in 16 bits) at the 16-bit inputs' default key tile
            lps = {"lp0": ptr}
            if gate < 2 and bk in (L.GRAD_BK, 128):
                lps["lp1"] = lp1
            if gate < 2 and bk == L.GRAD_BK:
                lps["lp2"] = lp2
            for lp, ptrs in lps.items():
                for i, cfg in enumerate(cfgs):
                    cex = dict(base, V=D, BK=bk, GATE=gate, DOT=0, PREC=True, **cfg.kwargs)
                    name = f"grad_k-g{gate}-bk{bk}-{lp}-c{i}"
                    jobs.append((name, delta_grad_k_kernel, ptrs, sc, cex, cfg.num_warps, cfg.num_stages))
        cex = dict(
            H=16,
            HV=16,
            K=D,
            V=D,
            BK=D,
            BV=32,
            GATE=gate,
            USE_H0=True,
            STORE_FINAL=True,
            L2NORM=True,
            IS_VARLEN=False,
        )
        jobs.append((f"recurrent-g{gate}", delta_recurrent_kernel, ptr, sc, cex, 4, 2))
    fin = dict(HV=16, K=D, BT=64, NK=D // L.GRAD_BK, GATE=1, IS_VARLEN=False)
    jobs.append(("grad_final", delta_grad_final_kernel, ptr, sc, fin, 4, 2))
    import triton.language as tl

    kda = dict(base, BK=L.KDA_BK, DOT=0, CT=tl.float32)
    kda_fwd = dict(kda, BK=L.KDA_FWD_BK, SPAN=L.KDA_DIAG_SPAN)
    # the single kernel (PART 0) and its two halves (LT2_KDA_SPLIT) at every config the autotuner
    # may run them with (`delta_launch._kda_narrow`: 2 warps for the halves, 1 for the Aqk half)
    for part in (0, 1, 2):
        for cfg in L._KDA_FWD_CONFIGS:
            bk, warps = cfg.kwargs["BK"], cfg.num_warps
            if (warps == 2 and part == 0) or (warps == 1 and part != 1):
                continue
            cex = dict(kda_fwd, BK=bk, PART=part)
            jobs.append(
                (f"kda_intra_fwd-p{part}-bk{bk}-w{warps}", kda_intra_fwd_kernel, ptr, sc, cex, warps, 1)
            )
    kda_grad = dict(kda, SPAN=L.KDA_DIAG_SPAN, HALF=0)
    jobs.append(("kda_grad_intra", kda_grad_intra_kernel, ptr, sc, kda_grad, L.KDA_WARPS, 1))
    for half in (1, 2):  # LT2_KDA_GRAD_SPLIT's two launches
        cex = dict(kda_grad, HALF=half)
        jobs.append((f"kda_grad_intra-half{half}", kda_grad_intra_kernel, ptr, sc, cex, L.KDA_WARPS, 1))
    # the tiles LT2_KDA_GRAD is timed at (bench/kernels_delta.py's KDA variants)
    for bk, warps in ((32, 8), (64, 8)):
        cex = dict(kda_grad, BK=bk)
        jobs.append((f"kda_grad_intra-bk{bk}-w{warps}", kda_grad_intra_kernel, ptr, sc, cex, warps, 1))
    return jobs


@pytest.mark.parametrize("job", _jobs(), ids=lambda j: j[0])
def test_compiles_for_sm90_within_resources(job):
    name, fn, ptr, sc, cex, warps, stages = job
    smem, regs, stack = _compile(fn, ptr, sc, cex, warps, stages)
    print(f"{name}: smem {smem} B, {regs} registers, stack {stack} B")
    assert smem <= SMEM_LIMIT, f"{name}: {smem} B of shared memory > {SMEM_LIMIT}"
    assert stack <= MAX_STACK, f"{name}: {stack} B of spills per thread"
