"""sm_90 compile jobs of the delta-rule family (DeltaNet, GDN, KDA; `common.aot`).

At K = V = 128, bf16 inputs, H = HV = 16, every form `delta_launch` may run: the three gates
(0 none, 1 scalar, 2 per key channel), the backward scratch in fp32 (the default, "lp0") and for
DeltaNet and GDN in 16 bits (LT2_DELTA_BWD_LP 1: the per-token tensors, "lp1"; 2: the C x C
matrices too, "lp2"), the reverse scan's (D16, FORM_Y, FORM_DU0) forms, KDA's split and single
intra-chunk kernels; each at every config of its autotuner (or the launch's fixed one). Spills
are bounded at MAX_STACK bytes per thread.
"""

from __future__ import annotations

import torch
import triton.language as tl

from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.delta import launch as L
from lt2dsl.kernels.delta.grad import delta_grad_final_kernel
from lt2dsl.kernels.delta.kda_grad import kda_grad_intra_kernel
from lt2dsl.kernels.delta.recurrent import delta_recurrent_kernel

MAX_STACK = 512  # bytes of per-thread stack (spills) tolerated at bf16
D = 128
P = "*bf16"
PTRS = {n: P for n in ("q", "k", "v", "beta", "o", "h", "vnew", "do", "dv", "dh", "w", "u")}
PTRS.update(cu_seqlens="*i64", chunk_indices="*i32", chunk_offsets="*i32")
# the backward's scratch dtypes (LT2_DELTA_BWD_LP): fp32, 16-bit per-token tensors, and the C x C
# matrices in 16 bits too
SCRATCH = {"lp0": PTRS, "lp1": dict(PTRS, du0=P, du=P, Y=P), "lp2": dict(PTRS, du0=P, du=P, Y=P, MA=P, MB=P)}
SCALARS = {"T": "i32", "R": "i32", "NC": "i32", "scale": "fp32"}
DT = torch.bfloat16
BASE = dict(H=16, HV=16, K=D, BT=64, IS_VARLEN=False, DOT=L.dot_mode(DT))
SCAN = dict(BASE, V=D, BK=L.state_bk(D), PREC=L.split_mode(DT))


def _jobs(name, tuned, cex, ptrs=PTRS, launch=None) -> list[Job]:
    return tuned_jobs(name, tuned, ptrs, SCALARS, cex, launch=launch, aligned=("T", "R"), max_stack=MAX_STACK)


def _prep(gate: int) -> list[Job]:
    cex = dict(BASE, BK=D, USE_G=bool(gate))
    return _jobs(f"delta/qk-g{gate}", L._qk_fwd, cex) + _jobs(f"delta/wy_rows-g{gate}", L._wy_rows, cex)


def _forward_scans(gate: int) -> list[Job]:
    """The split forward (W/U, state, output) and the fused scans; DeltaNet (gate 0) runs the
    scalar-gate code (gate 1) except in its transposed fused scan, which is gate-free."""
    jobs = []
    scan = dict(SCAN, GATE=gate, USE_H0=True, STORE_FINAL=True)
    if gate:
        jobs += _jobs(f"delta/wu-g{gate}", L._wu_fwd, dict(SCAN, GATE=gate))
        jobs += _jobs(f"delta/o_fwd-g{gate}", L._o_fwd, dict(SCAN, GATE=gate))
        for wu in (True, False):
            cex = dict(scan, STORE_VNEW=not wu, WU=wu)
            jobs += _jobs(f"delta/h_fwd-g{gate}-wu{wu:d}", L._h_fwd, cex)
    forms = ((False, False), (False, True), (True, True))
    for wu, save in forms if gate == 1 else ():
        jobs += _jobs(f"delta/ho_fwd-g{gate}-wu{wu:d}-save{save:d}", L._ho_fwd, dict(scan, SAVE=save, WU=wu))
    for wu, save in forms if gate <= 1 else ():
        cex = dict(scan, SAVE=save, WU=wu, EARLY_P=L.HOT_EARLY_P)
        jobs += _jobs(f"delta/hot_fwd-g{gate}-wu{wu:d}-save{save:d}", L._hot_fwd, cex)
    return jobs


def _reverse_forms(gate: int) -> list[tuple[bool, bool, bool, str]]:
    """(D16, FORM_Y, FORM_DU0, scratch) as `state_bwd` may run them: D16 (LT2_DELTA_BWD16) is
    DeltaNet's default and GDN's opt-in, never KDA's; Y = Tᵀ dU' (LT2_DELTA_Y_IN_SCAN) and Pᵀ dO
    (LT2_DELTA_DU0_IN_SCAN) formed in the scan for DeltaNet and GDN (not in GDN's 16-bit scan),
    with the 16-bit scratch they are timed with."""
    if gate == 0:
        return [(True, False, False, "lp0"), *[(True, y, u, "lp1") for y in (0, 1) for u in (0, 1)]]
    if gate == 1:
        return [(False, False, False, "lp0"), (True, False, False, "lp0"), (False, False, False, "lp1"),
                (False, True, False, "lp1"), (False, False, True, "lp1")]  # fmt: skip
    return [(False, False, False, "lp0")]


def _reverse_scans(gate: int) -> list[Job]:
    jobs = []
    bwd = dict(SCAN, GATE=gate, USE_DHT=True, STORE_DH0=True)
    if gate:
        jobs += _jobs(f"delta/state_bwd-g{gate}", L._state_bwd, bwd)
    if gate == 1:
        jobs += _jobs(f"delta/dht_bwd-g{gate}", L._dht_bwd, bwd)
    for d16, form_y, form_du0, lp in _reverse_forms(gate):
        cex = dict(bwd, D16=d16, FORM_Y=form_y, FORM_DU0=form_du0)
        name = f"delta/dhw_bwd{'16' if d16 else ''}-g{gate}-y{form_y:d}-u{form_du0:d}-{lp}"
        jobs += _jobs(name, L._dhw_bwd, cex, SCRATCH[lp])
    return jobs


def _scratches(gate: int) -> list[str]:
    """The backward scratch dtypes of a gate: KDA's stays fp32."""
    return ["lp0", "lp1"] if gate < 2 else ["lp0"]


def _gradients(gate: int) -> list[Job]:
    jobs = []
    cex = dict(SCAN, GATE=gate)
    for lp in _scratches(gate) if gate else ():
        if gate == 1:  # the Y pass is gate-free: once per scratch dtype; dv from it with 16-bit scratch
            y = dict(HV=16, V=D, BT=64, IS_VARLEN=False, DOT=BASE["DOT"], PREC=SCAN["PREC"], DT=tl.bfloat16,
                     STORE_DV=lp != "lp0")  # fmt: skip
            jobs += _jobs(f"delta/y-{lp}", L._y_bwd, y, SCRATCH[lp])
        jobs += _jobs(f"delta/du0-g{gate}-{lp}", L._du0, cex, SCRATCH[lp])
    cc_scratches = [*_scratches(gate), "lp2"] if gate < 2 else _scratches(gate)
    for form_y in (False, True):
        for lp in cc_scratches:
            # dv comes from the pass that forms a 16-bit Y (`delta_y_kernel`), else from this kernel
            cc = dict(cex, FORM_Y=form_y, STORE_DV=form_y or lp == "lp0")
            jobs += _jobs(f"delta/grad_cc-g{gate}-y{form_y:d}-{lp}", L._grad_cc, cc, SCRATCH[lp])
    return jobs + _grad_k(gate)


def _grad_k(gate: int) -> list[Job]:
    """Per key tile: KDA runs the 32-wide one only (`delta_launch.grad_bk`); the 16-bit scratch at
    the default and the 128-wide tile, BWD_LP 2 at the 16-bit inputs' default tile."""
    jobs = []
    tiles = L._grad_k_by_bk if gate < 2 else {L.FP32_GRAD_BK: L._grad_k_by_bk[L.FP32_GRAD_BK]}
    for bk, tuned in tiles.items():
        lps = ["lp0"]
        if gate < 2 and bk in (L.GRAD_BK, 128):
            lps.append("lp1")
        if gate < 2 and bk == L.GRAD_BK:
            lps.append("lp2")
        for lp in lps:
            cex = dict(SCAN, BK=bk, GATE=gate)
            jobs += _jobs(f"delta/grad_k-g{gate}-bk{bk}-{lp}", tuned, cex, SCRATCH[lp])
    return jobs


def _recurrent(gate: int) -> list[Job]:
    cex = dict(H=16, HV=16, K=D, V=D, BK=L.pow2(D), BV=min(32, L.pow2(D)), GATE=gate, USE_H0=True,
               STORE_FINAL=True, L2NORM=True, IS_VARLEN=False)  # fmt: skip
    # `delta_triton._recurrent`: 4 warps up to K = 128, Triton's default 3 stages
    return _jobs(f"delta/recurrent-g{gate}", delta_recurrent_kernel, cex, launch=(4, 3))


def _kda() -> list[Job]:
    """KDA's intra-chunk forward, the single kernel (PART 0) and its two halves (LT2_KDA_SPLIT),
    and its gradient kernel: single, split in halves (LT2_KDA_GRAD_SPLIT) and at the tiles
    LT2_KDA_GRAD is timed at (bench/kernels_delta.py's KDA variants)."""
    kda = dict(BASE, BK=L.KDA_BK, CT=L.compute_dtype(DT), SPAN=L.kda_diag_span(DT))
    jobs = []
    for part in (0, 1, 2):
        jobs += _jobs(f"delta/kda_intra_fwd-p{part}", L._kda_fwd, dict(kda, PART=part))
    tiles = {(L.KDA_BK, L.KDA_WARPS), (32, 8), (64, 8)}
    for half in (0, 1, 2):
        for bk, warps in sorted(tiles) if half == 0 else [(L.KDA_BK, L.KDA_WARPS)]:
            cex = dict(kda, BK=bk, HALF=half)
            name = f"delta/kda_grad_intra-half{half}-bk{bk}-w{warps}"
            jobs += _jobs(name, kda_grad_intra_kernel, cex, launch=(warps, 1))
    return jobs


def jobs() -> list[Job]:
    out = []
    for gate in (0, 1, 2):
        out += _prep(gate) if gate < 2 else []
        out += _forward_scans(gate) + _reverse_scans(gate) + _gradients(gate) + _recurrent(gate)
    fin = dict(HV=16, K=D, BT=64, NK=D // L.GRAD_BK, GATE=1, IS_VARLEN=False)
    out += _jobs("delta/grad_final", delta_grad_final_kernel, fin, launch=(4, 3))  # Triton's defaults
    return out + _kda()
