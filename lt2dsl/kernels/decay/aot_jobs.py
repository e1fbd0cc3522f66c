"""sm_90 compile jobs of the decay family's shared kernels (`common.aot`): the chunk-boundary state
scans (`chunk_h.py`), the chunk-local cumulative sum and the token-recurrent decode kernel, at
each gate mode (0 none, 1 scalar per token, 2 per key channel).

`DIMS` and `decay_jobs` are the decay family's common launch shape, used by `gla`, `simple_gla` and
`mlstm` too: K = V = 128, H = HV = 16, bf16 inputs and fp32 gates and states, fixed-length batches
(the varlen tables passed as None), each launch's tiles as its launch code computes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import triton

from lt2dsl.kernels.common.aot import Job, tuned_jobs

from ..common.tiles import block, dot_precision
from .chunk_h import chunk_bwd_dh_kernel, chunk_fwd_h_kernel
from .chunks import CHUNK, chunk_cumsum_kernel
from .recurrent import fused_recurrent_kernel

K = V = 128
DT = torch.bfloat16
DIMS = dict(
    H=16, HV=16, K=K, V=V, BT=CHUNK, BK=block(K), BV=block(V), IS_VARLEN=False, PREC=dot_precision(DT)
)
# the varlen tables of a fixed-length batch
NO_VARLEN = dict(cu_seqlens=None, chunk_idx=None, chunk_offsets=None)
SCALARS = {n: "i32" for n in ("T", "BTOT", "NTOT")} | {"scale": "fp32", "eps": "fp32"}


def decay_jobs(
    name: str, tuned, constexprs: Mapping[str, Any], fp32: Iterable[str] = (), launch=None, **kw
) -> list[Job]:
    """`tuned_jobs` with the decay family's types: the pointers named in `fp32` are fp32 (gates,
    states, scratch), the others bf16; fixed-length batches."""
    ptrs = {n: "*fp32" for n in fp32}
    cex = {**NO_VARLEN, **constexprs}
    return tuned_jobs(name, tuned, ptrs, SCALARS, cex, launch=launch, default_ptr="*bf16", **kw)


def jobs() -> list[Job]:
    out = []
    for g in (0, 1, 2):
        gate = {"g": None} if g == 0 else {}
        cex = dict(DIMS, G_MODE=g, **gate)
        fwd = dict(cex, HAS_H0=True, STORE_HT=True)
        out += decay_jobs(f"decay/fwd_h-g{g}", chunk_fwd_h_kernel, fwd, fp32=("g", "h0", "ht"))
        bwd = dict(cex, HAS_DHT=True, STORE_DH0=True)
        out += decay_jobs(f"decay/bwd_dh-g{g}", chunk_bwd_dh_kernel, bwd, fp32=("g", "dht", "dh0"))
        # `recurrent._launch`: the whole key, 32 value columns a program
        rec = dict(H=16, HV=16, K=K, V=V, BK=triton.next_power_of_2(K), BV=min(32, triton.next_power_of_2(V)),
                   G_MODE=g, HAS_H0=True, IS_VARLEN=False, cu_seqlens=None, **gate)  # fmt: skip
        out += decay_jobs(f"decay/recurrent-g{g}", fused_recurrent_kernel, rec, fp32=("g", "h0", "ht"))
    for S in (1, K):  # a scalar gate per token, one per key channel (`chunk_local_cumsum`)
        cex = dict(HV=16, S=S, BT=CHUNK, BS=min(64, triton.next_power_of_2(S)), IS_VARLEN=False)
        out += decay_jobs(f"decay/cumsum-S{S}", chunk_cumsum_kernel, cex, fp32=("g", "out"), launch=(4, 3))
    return out
