"""Helpers shared by the fused Triton kernels: autotune lists, program counts, row views.

Triton is imported inside the helpers that need it, so building or fusing a graph (which imports
`lt2dsl.kernels.fused`) does not import it; the kernel modules do when a kernel first runs.
"""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.backend import triton_interpreting


def configs(*warps: int) -> list:
    """Autotune candidates by warp count (the first only, under the CPU interpreter).

    None of the fused kernels uses `tl.dot`, so the Hopper dot/transposition miscompiles listed
    in shared/bench/README.md do not apply to them.
    """
    import triton

    out = [triton.Config({}, num_warps=w) for w in warps]
    return out[:1] if triton_interpreting() else out


def n_programs(device: torch.device, per_sm: int = 4) -> int:
    """Programs for a persistent reduction grid: a few per SM (a handful under the interpreter)."""
    if device.type == "cuda":
        return per_sm * torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def rows_view(t: torch.Tensor, width: int) -> torch.Tensor:
    """`t` as `[M, width]` with unit column stride: a view when the leading dims merge, else a copy."""
    t2 = t.reshape(-1, width)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def pow2(n: int) -> int:
    """The smallest power of two ≥ n (≥ 1)."""
    return 1 << (max(1, n) - 1).bit_length()
