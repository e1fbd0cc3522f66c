"""Prefill and the one-token decode step, separate functions; only the step is captured.

`prefill` runs prompts through a row group of a static cache in chunks (the chunked kernels, a
bounded activation footprint for long prompts). `decode_one` runs one token per row at each row's
own position. `Captured` records a step function as a CUDA graph after a warm-up run (which also does
the kernels' autotuning and lazy setup outside the capture); replaying it launches the whole looped
model without Python.

Manual `torch.cuda.CUDAGraph` capture rather than `torch.compile(mode="reduce-overhead")`: the
lowered graph calls Triton kernels through Python fronts that pick configs, autotune and check
arguments, and reads the cache through Python objects; a graph capture records only the launches
those fronts make, with no tracing of them by Dynamo and no recompilation per bucket or position.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lt2dsl.engine.cache import StaticCache


def prefill(model, ids: torch.Tensor, cache: StaticCache, chunk: int) -> torch.Tensor:
    """Run prompts `ids [R, T]` (one length) through the prefill view `cache` in chunks of at most
    `chunk` tokens; the last position's logits `[R, vocab]`."""
    logits = None
    for a in range(0, ids.shape[1], chunk):
        logits = model.graph_module(ids[:, a : a + chunk], cache)[:, -1]
    return logits


def decode_one(model, tok: torch.Tensor, cache: StaticCache) -> torch.Tensor:
    """One token per row `tok [B, 1]` at each row's position → logits `[B, vocab]`."""
    assert tok.shape[1] == 1, "decode_one takes one token per row"
    return model.graph_module(tok, cache)[:, -1]


def warm_up(fn: Callable[[], None], runs: int) -> None:
    """Run `fn` eagerly `runs` times on a side stream, then join the current stream: its lazy setup
    (autotuning, kernel loading, cuBLAS handles, RoPE tables) happens outside any capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(runs):
            fn()
    torch.cuda.current_stream().wait_stream(side)


def record(fn: Callable[[], None], generator=None, pool=None) -> torch.cuda.CUDAGraph:
    """A CUDA graph of one call of `fn`, drawing from `generator` (registered) in memory of `pool`."""
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph, pool=pool):
        fn()
    return graph


class Captured:
    """A CUDA graph of `fn()` (no arguments: it reads and writes static tensors only).

    Args:
        fn (Callable): the step; its Python runs during warm-up and capture only.
        generator (torch.Generator, Optional): a CUDA generator `fn` draws from, registered with the
            graph so each replay advances it as an eager call would.
        warmup (int, Optional): eager runs before the capture, on a side stream. One suffices:
            what a step sets up on first use (a kernel's config, chosen or read from disk, and its
            loaded binary; a cache's RoPE table) exists after it, and every further run costs one
            eager step of the whole model. Default: `1`.
        pool (Optional): a graph memory pool shared with other captures. Default: a new one.
    """

    def __init__(self, fn: Callable[[], None], generator=None, warmup: int = 1, pool=None):
        warm_up(fn, warmup)
        self.graph = record(fn, generator, pool)

    def __call__(self) -> None:
        self.graph.replay()
