"""Checks on Triton's TTGIR (the GPU-level IR) of a kernel compiled for sm_90, for the compile check
(`tests/kernels/aot_check.py`) and `bench/ttgir_hazard_scan.py`.

`pipeline_hazards` finds a pipelining race: a tile that feeds an asynchronous wgmma dot
(`ttng.warp_group_dot ... isAsync = true`) kept in ONE shared-memory buffer by the pipeliner while
a `warp_group_dot_wait` lets dots stay in flight (`pendings` > 0). The next iteration's prefetch
then writes the buffer the pending dots still read. Triton 3.6 and 3.9 both built it for the mLSTM
output kernel at 4 warps, 2 stages, when the q tile also had a non-dot use; on the H200 its output
was wrong by a different amount each run.
"""

from __future__ import annotations

import re


def pipeline_hazards(ttgir: str) -> list[tuple[str, int, list[int]]]:
    """(buffer, async dots reading it, distinct wait pendings) for each single-buffered async-dot
    operand in a kernel whose waits leave dots pending; empty when none."""
    waits = sorted({int(p) for p in re.findall(r"warp_group_dot_wait [^{]*\{pendings = (\d+)", ttgir)})
    if not any(waits):
        return []
    hits = []
    for buf in re.findall(r"(%\w+) = ttg\.local_alloc : \(\) -> !ttg\.memdesc<1x", ttgir):
        views = set(re.findall(r"(%\w+) = ttg\.memdesc_index " + re.escape(buf) + r"\[", ttgir))
        dots = [
            line
            for line in ttgir.splitlines()
            if "ttng.warp_group_dot " in line
            and "isAsync = true" in line
            and any(re.search(re.escape(v) + r"\b", line.split("=", 1)[1]) for v in views)
        ]
        if dots:
            hits.append((buf, len(dots), waits))
    return hits
