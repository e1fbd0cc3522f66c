"""How fast `tl.histogram` is on the GPU at 256 and 2048 bins against a plain counting pass, over
16384 rows of 30000 random 32-bit keys (2 GB): the measurement behind the DSA radix top-k's 8-bit
digits (`lt2dsl/kernels/dsa/triton_topk.py`).

    python3 bench/histogram_probe.py
"""

from __future__ import annotations

import functools
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _hist_kernel(KEYS, OUT, n, NB: tl.constexpr, SH: tl.constexpr, BLK: tl.constexpr):
    r = tl.program_id(0)
    base = KEYS + r.to(tl.int64) * n
    h = tl.zeros([NB], dtype=tl.int32)
    offs = tl.arange(0, BLK)
    for s0 in range(0, n, BLK):
        m = s0 + offs < n
        key = tl.load(base + s0 + offs, mask=m, other=0).to(tl.uint32, bitcast=True)
        d = ((key >> SH) & (NB - 1)).to(tl.int32)
        h += tl.histogram(d, NB, mask=m)
    tl.store(OUT + r * NB + tl.arange(0, NB), h)


@triton.jit
def _count_kernel(KEYS, OUT, n, BLK: tl.constexpr):
    r = tl.program_id(0)
    base = KEYS + r.to(tl.int64) * n
    c = tl.zeros([BLK], dtype=tl.int32)
    offs = tl.arange(0, BLK)
    for s0 in range(0, n, BLK):
        m = s0 + offs < n
        key = tl.load(base + s0 + offs, mask=m, other=0).to(tl.uint32, bitcast=True)
        c += (m & (key > 0x80000000)).to(tl.int32)
    tl.store(OUT + r, tl.sum(c, 0))


def _ms(fn, reps: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def main() -> None:
    R, n = 16384, 30000
    keys = torch.randint(-(2**31), 2**31 - 1, (R, n), device="cuda", dtype=torch.int32)
    out = torch.empty(R, 2048, device="cuda", dtype=torch.int32)
    for NB in (256, 2048):
        for blk, warps in ((4096, 8), (1024, 4), (2048, 4)):
            launch = _hist_kernel[(R,)]
            ms = _ms(functools.partial(launch, keys, out, n, NB=NB, SH=21, BLK=blk, num_warps=warps))
            print(f"histogram {NB:4d} bins, {blk} keys a step, {warps} warps: {ms:6.2f} ms", flush=True)
    ms = _ms(lambda: _count_kernel[(R,)](keys, out, n, BLK=2048, num_warps=8))
    print(f"counting pass: {ms:.2f} ms over {R * n * 4 / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
