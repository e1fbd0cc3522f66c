"""Decode engine: static caches, captured decode steps, batched generation, sampling, streaming.

`LT2Model.generate` is the compiler's one entry into this room (a lazy import). Layout, after
gpt-fast: `cache.py` (caches allocated once at their final size), `step.py` (prefill and the
one-token step as separate functions; only the step is captured), `sampling.py` (on the device),
`engine.py` (buckets, the generation loop, streaming), `bench.py` / `cli.py` (`lt2dsl bench decode`,
`lt2dsl warmup`). See docs/decode.md.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from lt2dsl.engine.cache import StaticCache
from lt2dsl.engine.engine import Engine, engine_for
from lt2dsl.engine.sampling import Sampling, sample

__all__ = ["Engine", "Sampling", "StaticCache", "engine_for", "sample", "stream"]


def stream(model, input_ids, max_new_tokens: int, **kwargs) -> Iterator[torch.Tensor]:
    """`model.generate`'s tokens one `[B]` column per step (arguments as `LT2Model.generate`).

    Each column is a view of the engine's output buffer, valid until the model's next generate
    or stream call; clone it to keep it. The model is in eval mode until the iterator ends.
    """
    return engine_for(model).stream(input_ids, max_new_tokens, **kwargs)
