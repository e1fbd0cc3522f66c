"""Plain copy: read a random string, a separator, then write the string again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from lt2dsl.tasks.base import IGNORE, TaskConfig, TaskData, check_batch_size, require, with_positions

SEP = 0


def copy(*, batch_size: int, seed: int | Sequence[int], length: int = 512, vocab: int = 32) -> TaskData:
    """x_1 … x_n SEP x_1 … x_n as a next-token task: the row is that string without its last token
    (2n tokens), labelled with x_1 … x_n from the separator on. `SEP` = 0; the string's ids are
    uniform in `[1, vocab)`.

    >>> print(copy(batch_size=1, seed=0, length=5, vocab=10).show())
    Inputs: 8 6 5 3 3 0 8 6 5 3
    Labels: - - - - - 8 6 5 3 3

    Slices: `position`.
    """
    check_batch_size(batch_size)
    require(length >= 1, f"length must be >= 1, got {length}")
    require(vocab >= 2, f"vocab must be >= 2 (the separator and one symbol), got {vocab}")
    rng = np.random.default_rng(seed)
    x = rng.integers(1, vocab, size=(batch_size, length), dtype=np.int64)
    sep = np.full((batch_size, 1), SEP, dtype=np.int64)
    ids = np.concatenate([x, sep, x[:, :-1]], axis=1)
    labels = np.concatenate([np.full((batch_size, length), IGNORE, dtype=np.int64), x], axis=1)
    return with_positions(TaskData(ids, labels))


class CopyConfig(TaskConfig):
    """`data = { task = "copy", length = 512 }`: rows of 2 · length tokens."""

    task: Literal["copy"] = "copy"
    length: int = Field(512, ge=1, description="tokens to copy (the row has 2 · length)")
    vocab: int = Field(32, ge=2, description="ids, the separator 0 included")
    description: ClassVar[str] = "copy a random string after a separator"
    generator: ClassVar = staticmethod(copy)

    @property
    def seq_len(self) -> int:
        return 2 * self.length
