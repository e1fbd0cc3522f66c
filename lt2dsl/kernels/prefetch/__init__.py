"""L2 weight prefetch for the decode step: a hint that brings a weight into the card's L2 cache
before the GEMM that reads it.

At decode every projection reads its whole weight for a handful of rows, and between two
projections the step runs a chain of small latency-bound kernels (norms, the short conv, the
recurrence, attention over the cache) during which HBM is nearly idle. `l2_prefetch(w, max_bytes)`
launches `triton_prefetch.l2_prefetch_kernel` on the current stream: bulk prefetches of the
first `max_bytes` of w's storage into L2, no data returned to the SMs and no tensor written, so it
never changes a result. The FX rule that schedules it (`lowering/fx_passes/prefetch.py`) runs it on
a side stream after each projection for the next one's weight.

There is nothing to run on the CPU (the interpreter has no inline PTX): off CUDA it does nothing.
"""

from __future__ import annotations

import torch

from lt2dsl.env import triton_interpreting

from .naive import plan_ref

__all__ = ["l2_prefetch", "plan_ref", "prefetch_bytes"]


def prefetch_bytes(t: torch.Tensor, max_bytes: int, offset: int = 0) -> int:
    """Bytes `l2_prefetch` asks for: min(max_bytes, t's bytes past `offset`) of a contiguous tensor
    on a 16-byte aligned address, from `offset` rounded down to 16, rounded down to 16 (0 where it
    does not apply)."""
    offset -= offset % 16
    if not t.is_contiguous() or t.data_ptr() % 16 or max_bytes <= 0 or offset < 0:
        return 0
    return max(0, min(max_bytes, t.numel() * t.element_size() - offset)) // 16 * 16


def l2_prefetch(t: torch.Tensor, max_bytes: int, offset: int = 0) -> int:
    """Ask L2 for `max_bytes` of `t` from byte `offset` on the current CUDA stream; the bytes asked
    for (0 off CUDA, under the interpreter, or for a tensor that is not contiguous and 16-byte
    aligned)."""
    if t.device.type != "cuda" or triton_interpreting():
        return 0
    nbytes = prefetch_bytes(t, max_bytes, offset)
    if nbytes:
        from .triton_prefetch import BLOCK, CHUNK, l2_prefetch_kernel, programs

        with torch.cuda.device(t.device):
            raw = t.view(-1).view(torch.uint8)[offset - offset % 16 :]
            l2_prefetch_kernel[(programs(nbytes),)](raw, nbytes, CHUNK, BLOCK, num_warps=4)
    return nbytes
