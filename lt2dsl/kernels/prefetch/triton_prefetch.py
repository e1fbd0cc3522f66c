"""Triton kernel of the L2 weight prefetch: bulk prefetches of a byte range into the card's L2.

Each program issues BLOCK prefetches of CHUNK bytes (`cp.async.bulk.prefetch.L2.global`, sm_90:
one instruction per chunk, no data returned to the SM, so a few programs cover tens of MB); the
last chunk is cut to the range and rounded down to the instruction's 16-byte granule (a hint: the
few bytes past it are left to the GEMM that reads them). `_plan` is the address arithmetic alone,
which `plan_kernel` writes out so the interpreter can check it (inline PTX has no interpreter).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lt2dsl.kernels.common.tl_util import helper

CHUNK = 16 * 1024  # bytes one prefetch instruction asks for
BLOCK = 128  # prefetches per program: one per thread of 4 warps
# the instruction asks for a multiple of 16 bytes at a 16-byte aligned address
_PREFETCH = tl.constexpr("""{
.reg .pred p;
setp.ne.s32 p, $2, 0;
@p cp.async.bulk.prefetch.L2.global [$1], $2;
mov.u32 $0, 0;
}""")


@helper
def _plan(nbytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """(offsets, sizes) of this program's chunks: offset i·CHUNK, size min(CHUNK, nbytes − offset)
    rounded down to 16 bytes (0: nothing to fetch)."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    start = idx * CHUNK
    size = tl.minimum(nbytes - start, CHUNK)
    size = tl.where(size > 0, (size // 16) * 16, 0)
    return start, size.to(tl.int32)


@triton.jit
def l2_prefetch_kernel(base, nbytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Prefetch bytes [0, nbytes) of `base` (a 16-byte aligned `*u8`) into L2."""
    start, size = _plan(nbytes, CHUNK, BLOCK)
    addr = base + start
    tl.inline_asm_elementwise(_PREFETCH, "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def plan_kernel(offsets, sizes, nbytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Write `_plan`'s chunks of every program: the prefetch kernel's addresses, checkable on the CPU."""
    start, size = _plan(nbytes, CHUNK, BLOCK)
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(offsets + idx, start)
    tl.store(sizes + idx, size)


def programs(nbytes: int, chunk: int = CHUNK, block: int = BLOCK) -> int:
    return triton.cdiv(triton.cdiv(nbytes, chunk), block)
