"""What a training forward keeps for backward, measured: the counterpart of the estimate's
activation elements per token and block application (`cost.estimate.block_activations`).

`saved_bytes(fn)` runs `fn()` under autograd's saved-tensor hooks and adds up the distinct
storages packed for backward (a view pins its whole storage, so that is what it costs).
`per_token_application(saved)` takes the mixed difference of `saved(n, T)` over two model depths
and two lengths: weights, their copies, the embedding and the head cancel, and what is left is
bytes per token per block application.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def saved_bytes(fn: Callable[[], Any]) -> int:
    """Bytes of the distinct storages autograd saves for backward while `fn()` runs."""
    seen: dict[tuple, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[(t.device, storage.data_ptr())] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def per_token_application(
    saved: Callable[[int, int], int], depths: tuple[int, int] = (1, 2), lengths: tuple[int, int] = (64, 128)
) -> float:
    """Saved bytes per token per block application.

    Args:
        saved: `saved(n, T)` → bytes saved by one forward of the model built with `n` units of
            block applications (layers, or a loop's iterations) over `T` tokens.
        depths, lengths (Optional): the two `n` and the two `T`. Default: `(1, 2)`, `(64, 128)`.
    Returns:
        Bytes per token per unit of `n` (divide by the applications in a unit for per application).
    """
    (n1, n2), (t1, t2) = depths, lengths
    if n1 == n2 or t1 == t2:
        raise ValueError(f"depths and lengths must each hold two different values, got {depths}, {lengths}")
    mixed = (saved(n2, t2) - saved(n1, t2)) - (saved(n2, t1) - saved(n1, t1))
    return mixed / ((n2 - n1) * (t2 - t1))
