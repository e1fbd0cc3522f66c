"""Needle in a haystack (token-level, after RULER's single and multi-key needles): find the value
stored under a key somewhere in a long random context.

With `start_context` set, training follows the length curriculum (`tasks.curriculum`): stage k
trains at context 2^(k+2) from `start_context` up to `context`, moving on once the training
batches' exact match reaches `threshold`; evaluation is at `context`. A haystack learned short
first is how a small model trained from scratch finds needles at all: on the CPU, DeltaNet at a
fixed context of 256 stayed at chance for 1000 steps, with one query a row and with four."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from lt2dsl.tasks.base import (
    IGNORE,
    TaskConfig,
    TaskData,
    check_batch_size,
    distinct_draws,
    require,
    with_positions,
)
from lt2dsl.tasks.curriculum import Curriculum, stage_length

NEEDLE, QUERY = 0, 1
FIRST = 2  # the first id of keys, values and filler
DEPTHS = {i: f"{10 * i}-{10 * i + 10}%" for i in range(10)}


def niah(
    *,
    batch_size: int,
    seed: int | Sequence[int],
    context: int = 2048,
    num_needles: int = 1,
    key_len: int = 2,
    value_len: int = 4,
    vocab: int = 256,
    num_queries: int = 1,
) -> TaskData:
    """A haystack of random ids holding `num_needles` needles `NEEDLE k_1…k_K v_1…v_V` (distinct
    keys, non-overlapping, uniformly placed), then `QUERY` and one needle's key; the labels are
    that needle's value tokens (as a next-token task, so the row has exactly `context` tokens).
    `NEEDLE` = 0, `QUERY` = 1; keys, values and filler are ids in `[2, vocab)`. With one
    needle this is single-key NIAH, with more the others are distractors (multi-key).
    `num_queries` > 1 (at most `num_needles`) ends the row with that many queries, `QUERY` key
    value each, of distinct needles in random order, every value labelled (RULER's multi-query
    NIAH): num_queries · value_len answers a row instead of value_len, the same haystack task.

    >>> print(niah(batch_size=1, seed=0, context=18, num_needles=2, key_len=1, value_len=2,
    ...            vocab=10).show())
    Inputs: 0 2 8 5 0 4 5 5 3 8 7 9 6 6 9 1 2 8
    Labels: - - - - - - - - - - - - - - - - 8 5
    >>> print(niah(batch_size=1, seed=0, context=24, num_needles=2, key_len=1, value_len=2,
    ...            vocab=10, num_queries=2).show())
    Inputs: 8 7 0 8 2 2 2 2 3 8 0 9 7 6 9 7 7 1 8 2 2 1 9 7
    Labels: - - - - - - - - - - - - - - - - - - 2 2 - - 7 6

    Slices: `position` and `depth` (where the queried needle starts in the haystack, by tenths).
    """
    check_batch_size(batch_size)
    B, N, K, V, Q = batch_size, num_needles, key_len, value_len, num_queries
    S = 1 + K + V  # tokens per needle; each query is QUERY + key + value too
    H = context + 1 - Q * S  # haystack length (the row drops the last value token)
    require(min(N, K, V, Q) >= 1, "num_needles, key_len, value_len and num_queries must be >= 1")
    require(Q <= N, f"num_queries={Q} asks for more distinct needles than num_needles={N}")
    require(vocab - FIRST >= N, f"vocab={vocab} has too few ids for {N} distinct keys")
    require(H >= N * S, f"context={context} cannot hold {N} needles of {S} tokens and {Q} queries")
    rng = np.random.default_rng(seed)
    z = rng.integers(FIRST, vocab, size=(B, context + 1), dtype=np.int64)
    keys = rng.integers(FIRST, vocab, size=(B, N, K), dtype=np.int64)
    keys[:, :, 0] = distinct_draws(rng, B, vocab - FIRST, N) + FIRST
    values = rng.integers(FIRST, vocab, size=(B, N, V), dtype=np.int64)
    start = np.sort(rng.integers(0, H - N * S + 1, size=(B, N)), axis=1) + S * np.arange(N)
    rows = np.arange(B)[:, None]
    z[rows, start] = NEEDLE
    for j in range(K):
        z[rows, start + 1 + j] = keys[:, :, j]
    for j in range(V):
        z[rows, start + 1 + K + j] = values[:, :, j]
    # one query keeps its single draw, so single-query rows are those of the one-query task
    asked = rng.integers(0, N, size=(B, 1)) if Q == 1 else distinct_draws(rng, B, N, Q)
    b = np.arange(B)
    labels = np.full((B, context + 1), IGNORE, dtype=np.int64)
    depth = np.zeros((B, context + 1), dtype=np.int64)
    for i in range(Q):
        q, at = asked[:, i], H + i * S
        z[:, at] = QUERY
        z[:, at + 1 : at + 1 + K] = keys[b, q]
        z[:, at + 1 + K : at + S] = values[b, q]
        labels[:, at + K : at + K + V] = values[b, q]
        depth[:, at : at + S] = np.minimum(10 * start[b, q] // H, 9)[:, None]
    data = with_positions(TaskData(z[:, :context], labels[:, :context]))
    # where each query's needle sits; positions before the first query carry the first one's
    depth[:, :H] = depth[:, H : H + 1]
    data.slices["depth"] = depth[:, :context].copy()
    data.names["depth"] = DEPTHS
    return data


class NIAHConfig(TaskConfig):
    """`data = { task = "niah", context = 2048, num_needles = 4 }` (1 needle: single key)."""

    task: Literal["niah"] = "niah"
    context: int = Field(2048, ge=4, description="tokens per row (512–8k in the experiments)")
    num_needles: int = Field(1, ge=1, description="needles in the haystack; 1 = single key")
    key_len: int = Field(2, ge=1)
    value_len: int = Field(4, ge=1)
    vocab: int = Field(256, ge=3, description="ids: needle 0, query 1, content 2…")
    num_queries: int = Field(
        1, ge=1, description="queries a row ends with, of distinct needles (≤ num_needles)"
    )
    start_context: int | None = Field(
        None, ge=4, description="first context of a length curriculum (powers of two up to context)"
    )
    description: ClassVar[str] = "needle in a haystack, single or multi-key, optionally with a curriculum"
    generator: ClassVar = staticmethod(niah)
    CONTROLS: ClassVar[frozenset[str]] = TaskConfig.CONTROLS | {"start_context"}

    @model_validator(mode="after")
    def _curriculum_fits(self):
        if self.start_context is None:
            return self
        for n, name in ((self.start_context, "start_context"), (self.context, "context")):
            require(n & (n - 1) == 0, f"{name}={n} must be a power of two with a curriculum")
        start, context = self.start_context, self.context
        require(start <= context, f"start_context={start} is past context={context}")
        require(self.threshold is not None, "a curriculum needs a threshold to move on")
        self.curriculum()  # its stages exist (context at most 2^16)
        self.at_stage(_stage(self.start_context)).generate(1, 0)  # the needles fit the first stage
        return self

    def generatable(self) -> bool:
        return self.start_context is None

    @property
    def seq_len(self) -> int:
        return self.context

    def curriculum(self) -> Curriculum | None:
        if self.start_context is None:
            return None
        return Curriculum(_stage(self.start_context), _stage(self.context), self.threshold, self.window)

    def at_stage(self, stage: int) -> NIAHConfig:
        """The fixed-context config of curriculum stage `stage` (context 2^(stage+2))."""
        return self.model_copy(update={"context": stage_length(stage), "start_context": None})

    def eval_variants(self) -> dict[str, TaskConfig]:
        """Scored at `context` alone, also after a curriculum."""
        return {"": self.at_stage(_stage(self.context)) if self.start_context is not None else self}


def _stage(context: int) -> int:
    """The curriculum stage whose rows are `context` tokens (a power of two ≥ 2)."""
    return context.bit_length() - 3
