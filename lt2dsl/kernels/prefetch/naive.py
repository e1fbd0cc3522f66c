"""Reference of the prefetch plan: the (offset, size) of every chunk the kernel asks L2 for.

A prefetch has no result to compare (it changes no tensor); what can be wrong is its address
arithmetic, which `plan_ref` states in plain Python for `triton_prefetch.plan_kernel` to match.
"""

from __future__ import annotations


def plan_ref(nbytes: int, chunk: int, block: int, n_programs: int) -> list[tuple[int, int]]:
    """(offset, size) of each of the n_programs · block slots: offset i·chunk, size the bytes of
    [offset, min(offset + chunk, nbytes)) rounded down to 16, 0 past the range."""
    out = []
    for i in range(n_programs * block):
        start = i * chunk
        size = max(0, min(chunk, nbytes - start)) // 16 * 16
        out.append((start, size))
    return out
