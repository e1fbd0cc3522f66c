"""Offline sm_90 (H200) PTX statistics of the scan kernels against their counterparts, no GPU.

For each kernel, compiled by Triton for sm_90 at the benchmark shape (H=16, K=V=128, chunks of 64,
bf16): shared memory, and static counts in the PTX of barriers (`bar.sync`), pipelined copies
(`cp.async`), plain global loads (outside the software pipeline), `ex2` (exponentials) and tensor-core
instructions. A sequential scan pays for each barrier and unpipelined load on every chunk, so these
counts located the mLSTM scans' gap to `simple_gla`'s (BENCHMARKS.md, decay family).

    python3 bench/ptx_stats.py            # lt2dsl's kernels
    PEER=/path/to/site python3 bench/ptx_stats.py   # also the peer's GDN scan, from an fla install

Needs Triton's NVIDIA backend (ptxas is not run); under TRITON_INTERPRET it is switched off here.
"""

from __future__ import annotations

import os
import re
import sys
import types

os.environ.pop("TRITON_INTERPRET", None)

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

PATTERNS = {
    "barriers": r"bar\.sync|barrier\.sync",
    "cp.async": r"cp\.async\.",
    "ld.global": r"ld\.global",
    "ex2": r"ex2\.approx",
    "mma": r"wgmma\.mma_async|mma\.sync",
}


def _jit(kernel):
    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


def stats(kernel, bf16: set, constexprs: dict, num_warps: int = 4, num_stages: int = 2) -> dict:
    """Shared bytes and the PTX counts of `kernel` at these constexprs (pointers fp32 unless in bf16)."""
    fn = _jit(kernel)
    sig = {}
    for n in fn.arg_names:
        if n in constexprs:
            sig[n] = "constexpr"
        elif n in ("T", "NTOT"):
            sig[n] = "i32"
        elif n in ("scale", "eps"):
            sig[n] = "fp32"
        elif n in ("cu_seqlens", "chunk_offsets", "chunk_idx"):
            sig[n] = "*i32"
        else:
            sig[n] = "*bf16" if n in bf16 else "*fp32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")}
    cex = {(fn.arg_names.index(k),): v for k, v in constexprs.items() if k in fn.arg_names}
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cex, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options=opts)  # fmt: skip
    ptx = compiled.asm["ptx"]
    return {"smem": compiled.metadata.shared, **{k: len(re.findall(p, ptx)) for k, p in PATTERNS.items()}}


def _row(name: str, s: dict) -> None:
    print(f"{name:34s} " + "  ".join(f"{k} {v:6d}" for k, v in s.items()), flush=True)


def main() -> None:
    from lt2dsl.kernels.common import decay_chunk_h
    from lt2dsl.kernels.common.delta_split import delta_h_fwd_kernel
    from lt2dsl.kernels.mlstm import chunk, chunk_bwd

    d = dict(H=16, HV=16, K=128, V=128, BT=64, BK=64, BV=64, IS_VARLEN=False, PREC="tf32")
    _row("simple_gla state scan", stats(decay_chunk_h.chunk_fwd_h_kernel, {"k", "v", "h"},
                                        dict(d, G_MODE=1, HAS_H0=False, STORE_HT=False)))  # fmt: skip
    _row("simple_gla dh scan", stats(decay_chunk_h.chunk_bwd_dh_kernel, {"q", "do", "dh"},
                                     dict(d, G_MODE=1, HAS_DHT=False, STORE_DH0=False)))  # fmt: skip
    _row("mlstm state scan", stats(chunk.fwd_state_kernel, {"k", "v", "Cs"}, dict(d, HAS_H0=False)))
    _row("mlstm dh scan", stats(chunk_bwd.bwd_dh_kernel, {"q", "dnum", "dCs"},
                                dict(d, HAS_DHT=False, STORE_DH0=False)))  # fmt: skip
    g = dict(d, BK=128, GATE=1, USE_H0=False, STORE_FINAL=False, STORE_VNEW=False, DOT=0, PREC=True)
    bf = {"k", "v", "w", "u", "h", "vnew", "h0"}
    _row("gdn state scan", stats(delta_h_fwd_kernel, bf, dict(g, WU=False)))
    _row("gdn state scan (LT2_DELTA_WU)", stats(delta_h_fwd_kernel, bf, dict(g, WU=True)))
    peer = os.environ.get("PEER")
    if peer:  # the peer's scan needs einops only at import time
        sys.path.insert(0, peer)
        stub = types.ModuleType("einops")
        stub.rearrange = stub.repeat = stub.reduce = stub.einsum = lambda *a, **k: None
        sys.modules.setdefault("einops", stub)
        from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_kernel_h_blockdim64 as ph

        p = dict(H=16, HV=16, K=128, V=128, BT=64, BV=64, USE_G=True, USE_GK=False)
        p.update(USE_INITIAL_STATE=False, STORE_FINAL_STATE=False, SAVE_NEW_VALUE=True)
        p.update(STATE_V_FIRST=False, IS_VARLEN=False)
        _row("peer gdn state scan", stats(ph, {"k", "v", "w", "v_new", "h", "h0", "ht"}, p))


if __name__ == "__main__":
    main()
