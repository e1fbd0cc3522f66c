"""Grid barriers inside one launch: phases that would be separate launches run in one, every program
waiting at each barrier until all have arrived.

The barrier is an int64 counter in device memory that only grows: each program adds 1 at each
barrier, so a launch of P programs through N barriers adds N·P, and a program's first read of it,
rounded down to N·P, is the launch's base (`barrier_base`; the other programs can have added at most
P − 1 before that read, since none passes the first barrier without it). There is no reset between
launches, so a CUDA graph replays the launch as it is. That holds only while every launch on a
counter adds the same N·P: `barrier_counter` keeps one counter per (device, P, N).

Every program must be resident at once, or the ones waiting keep the others from starting: the
launch code asks for a cooperative launch (`launch_cooperative_grid`, an error rather than a hang
where the grid cannot be co-resident) on a GPU. Under the CPU interpreter programs run one after
another, so a barrier with more than one program would wait forever: the kernels run their phases
as separate launches there.

Data one program writes and another reads after a barrier is read through L2 (`.cg`) or for the
first time in the launch (L1 holds no stale copy of it).
"""

from __future__ import annotations

import torch
import triton.language as tl
from torch import Tensor

from .tl_util import helper

_COUNTERS: dict[tuple[torch.device, int, int], Tensor] = {}


def barrier_counter(device: torch.device, programs: int, barriers: int) -> Tensor:
    """The counter of launches of `programs` programs through `barriers` barriers on `device`
    (int64, one element). Made before a CUDA graph captures a launch that uses it."""
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" are one counter
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, programs, barriers)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(1, device=device, dtype=torch.int64)
    return _COUNTERS[key]


@helper
def barrier_base(bar, span):
    """This launch's base on counter `bar`: its first read rounded down to span = N·P."""
    return (tl.atomic_add(bar, 0, sem="acquire", scope="gpu") // span) * span


@helper
def grid_barrier(bar, target):
    """Wait until the counter reaches `target` (base + i·P at barrier i): every program's writes
    before it are visible to every program after it (CTA barrier, one release add, acquire reads)."""
    tl.debug_barrier()
    tl.atomic_add(bar, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
