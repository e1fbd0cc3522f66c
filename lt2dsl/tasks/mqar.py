"""Multi-query associative recall (MQAR, Arora et al. 2023, "Zoology"): recall the value bound
to each key when the key comes back, for many keys at once."""

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
    pow2_buckets,
    require,
    weighted_draws,
    with_positions,
)


def mqar(
    *,
    batch_size: int,
    seed: int | Sequence[int],
    vocab: int = 8192,
    length: int = 256,
    num_kv_pairs: int = 16,
    power_a: float = 0.01,
    random_non_queries: bool = True,
) -> TaskData:
    """Key-value pairs k_1 v_1 … k_N v_N, then each key once more at a random later slot followed
    by its value; the label at a repeated key is its value. Keys are distinct ids from
    `[1, vocab/2)`, values ids from `[vocab/2, vocab)` (repeats allowed); a row has `length` ids.

    After the 2N context tokens the row has (length − 2N) // 2 two-token slots; the N queries
    take distinct slots drawn with probability ∝ (j + 1)^(power_a − 1) for slot j, so most queries
    come soon after the context and a long tail comes late (zoology's power-law gaps). The other
    positions hold random ids (`random_non_queries`) or 0.

    >>> print(mqar(batch_size=1, seed=0, vocab=16, length=16, num_kv_pairs=3).show())
    Inputs:  4 15  3 13  2 13  2 13  0  0  3 13 10  8  4 15
    Labels:  -  -  -  -  -  - 13  -  -  - 13  -  -  - 15  -

    Slices: `position` and `distance` (power-of-two buckets of the gap between a query and its
    pair in the context).
    """
    check_batch_size(batch_size)
    B, N, half = batch_size, num_kv_pairs, vocab // 2
    slots = (length - 2 * N) // 2
    require(N >= 1, f"num_kv_pairs must be >= 1, got {N}")
    require(half - 1 >= N, f"vocab={vocab} leaves {half - 1} keys for {N} pairs")
    require(slots >= N, f"length={length} has room for {slots} queries after the context, need {N}")
    require(power_a > 0, f"power_a must be > 0, got {power_a}")
    rng = np.random.default_rng(seed)
    keys = distinct_draws(rng, B, half - 1, N) + 1
    values = rng.integers(half, vocab, size=(B, N), dtype=np.int64)
    slot = weighted_draws(rng, np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1), B, N)
    pair = distinct_draws(rng, B, N, N)  # pair[b, i]: the pair queried in the i-th drawn slot
    if random_non_queries:
        ids = rng.integers(0, vocab, size=(B, length), dtype=np.int64)
    else:
        ids = np.zeros((B, length), dtype=np.int64)
    ids[:, 0 : 2 * N : 2], ids[:, 1 : 2 * N : 2] = keys, values
    rows = np.arange(B)[:, None]
    at = 2 * N + 2 * slot  # [B, N] positions of the repeated keys
    ids[rows, at] = keys[rows, pair]
    ids[rows, at + 1] = values[rows, pair]
    labels = np.full((B, length), IGNORE, dtype=np.int64)
    labels[rows, at] = values[rows, pair]
    distance = np.zeros((B, length), dtype=np.int64)
    distance[rows, at] = at - 2 * pair
    data = with_positions(TaskData(ids, labels))
    data.slices["distance"], data.names["distance"] = pow2_buckets(distance)
    return data


class MQARConfig(TaskConfig):
    """`data = { task = "mqar", num_kv_pairs = 16, seq_len = 256 }`."""

    task: Literal["mqar"] = "mqar"
    vocab: int = Field(8192, ge=4, description="token ids (keys in the lower half, values the upper)")
    length: int = Field(256, ge=4, description="tokens per row")
    num_kv_pairs: int = Field(16, ge=1)
    power_a: float = Field(0.01, gt=0, description="power-law exponent of the query gaps")
    random_non_queries: bool = True
    description: ClassVar[str] = "multi-query associative recall (zoology)"
    generator: ClassVar = staticmethod(mqar)

    @property
    def seq_len(self) -> int:
        return self.length
