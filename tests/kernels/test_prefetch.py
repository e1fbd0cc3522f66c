"""L2 weight prefetch (`lt2dsl.kernels.prefetch`): the plan kernel's chunks (CPU interpreter here)
against `plan_ref` on ranges that end mid-chunk and off the 16-byte granule; the front's byte
count; on a GPU, that the prefetch runs, also inside a CUDA graph, and writes nothing."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.kernels.prefetch import l2_prefetch, plan_ref, prefetch_bytes
from lt2dsl.kernels.prefetch import triton_prefetch as P

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("nbytes", [16, 1000, 16 * 1024, 16 * 1024 + 40, 5 * 16 * 1024 - 7, 300_000])
@pytest.mark.parametrize("chunk, block", [(1024, 4), (16 * 1024, 8)])
def test_plan_kernel_matches_the_reference(nbytes, chunk, block):
    n = P.programs(nbytes, chunk, block)
    offsets = torch.full((n * block,), -1, dtype=torch.int64, device=DEVICE)
    sizes = torch.full((n * block,), -1, dtype=torch.int32, device=DEVICE)
    P.plan_kernel[(n,)](offsets, sizes, nbytes, chunk, block)
    got = list(zip(offsets.tolist(), sizes.tolist()))
    assert got == plan_ref(nbytes, chunk, block, n)
    # every 16-byte granule of the range that a whole granule covers is asked for, once
    assert sum(s for _, s in got) == sum(min(chunk, nbytes - o) // 16 * 16 for o, _ in got if o < nbytes)
    assert all(s % 16 == 0 and 0 <= s <= chunk for _, s in got)


def test_prefetch_bytes_is_capped_offset_and_refuses_views_it_cannot_address():
    w = torch.empty(64, 100, dtype=torch.bfloat16)
    assert prefetch_bytes(w, 1 << 30) == 64 * 100 * 2
    assert prefetch_bytes(w, 1000) == 992
    assert prefetch_bytes(w, 0) == 0
    # from an offset (rounded down to 16): what is left of the tensor past it, at most max_bytes
    assert prefetch_bytes(w, 1 << 30, offset=100) == 64 * 100 * 2 - 96
    assert prefetch_bytes(w, 500, offset=12000) == 496
    assert prefetch_bytes(w, 500, offset=64 * 100 * 2) == 0
    assert prefetch_bytes(w.t(), 1 << 30) == 0  # not contiguous
    assert prefetch_bytes(w.view(-1)[1:], 1 << 30) == 0  # 2 bytes past an aligned address


def test_off_cuda_it_does_nothing():
    assert l2_prefetch(torch.ones(1024, dtype=torch.bfloat16), 1 << 20) == 0


@pytest.mark.gpu
def test_prefetch_runs_in_a_graph_and_writes_nothing():
    w = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    before = w.clone()
    assert l2_prefetch(w, 1 << 30) == w.numel() * 2
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.graph(g):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            l2_prefetch(w, 8 << 20, offset=4096)
        torch.cuda.current_stream().wait_stream(side)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(w, before)
