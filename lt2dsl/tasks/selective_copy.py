"""Selective copy (Gu & Dao 2023, "Mamba", §4.1.1): copy the few symbols scattered in a noise
context, in order, skipping the blanks — the content-aware version of copying."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from lt2dsl.tasks.base import (
    IGNORE,
    TaskConfig,
    TaskData,
    check_batch_size,
    distinct_draws,
    require,
    with_positions,
)

BLANK, GO = 0, 1


def selective_copy(
    *,
    batch_size: int,
    seed: int | Sequence[int],
    context: int = 512,
    num_tokens: int = 16,
    vocab: int = 16,
) -> TaskData:
    """A context of `context` tokens, all `BLANK` (0) but `num_tokens` symbols from
    `[2, vocab)` at random positions; then `GO` (1) and the symbols in order of appearance,
    as a next-token task (row length context + num_tokens, the last symbol not fed back).

    >>> print(selective_copy(batch_size=1, seed=4, context=8, num_tokens=3, vocab=8).show())
    Inputs: 0 0 0 6 0 7 0 3 1 6 7
    Labels: - - - - - - - - 6 7 3

    Slices: `position`.
    """
    check_batch_size(batch_size)
    B, L, M = batch_size, context, num_tokens
    require(M >= 1, f"num_tokens must be >= 1, got {M}")
    require(L >= M, f"context={L} cannot hold num_tokens={M} symbols")
    require(vocab >= 3, f"vocab must be >= 3 (blank, go and one symbol), got {vocab}")
    rng = np.random.default_rng(seed)
    where = np.sort(distinct_draws(rng, B, L, M), axis=1)
    symbols = rng.integers(2, vocab, size=(B, M), dtype=np.int64)
    ids = np.full((B, L + M), BLANK, dtype=np.int64)
    ids[np.arange(B)[:, None], where] = symbols
    ids[:, L] = GO
    ids[:, L + 1 :] = symbols[:, :-1]
    labels = np.full((B, L + M), IGNORE, dtype=np.int64)
    labels[:, L:] = symbols
    return with_positions(TaskData(ids, labels))


class SelectiveCopyConfig(TaskConfig):
    """`data = { task = "selective_copy", context = 512, num_tokens = 16 }`."""

    task: Literal["selective_copy"] = "selective_copy"
    context: int = Field(512, ge=1, description="noise context holding the symbols")
    num_tokens: int = Field(16, ge=1, description="symbols to copy")
    vocab: int = Field(16, ge=3, description="ids: blank 0, go 1, symbols 2…")
    description: ClassVar[str] = "copy the symbols scattered in a blank context, in order"
    generator: ClassVar = staticmethod(selective_copy)

    @property
    def seq_len(self) -> int:
        return self.context + self.num_tokens
