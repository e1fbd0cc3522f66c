"""Shared pieces of the linear-recurrent specs: conv weights and caches, chunked core FLOPs."""

from __future__ import annotations

from lt2dsl.ir.spec import CacheTensor

CHUNK = 64  # chunk size of the chunked kernels (mixers.md §0)


def chunk_of(L: int) -> int:
    """A prefill shorter than one chunk runs as one chunk of L tokens."""
    return max(1, min(CHUNK, L))


def conv_weights(channels: dict[str, int], W: int) -> dict[str, tuple[int, ...]]:
    """Depthwise causal conv weights `<name>_conv1d.weight` (C, 1, W), no bias (fla)."""
    if W <= 0:
        return {}
    return {f"{n}_conv1d.weight": (c, 1, W) for n, c in channels.items()}


def conv_cache(channels: dict[str, int], W: int, batch: int) -> dict[str, CacheTensor]:
    """The last W−1 inputs per channel, in the activation dtype (W−1 suffice; fla keeps W)."""
    if W <= 1:
        return {}
    return {f"{n}_conv": CacheTensor((batch, c, W - 1), "state", "act") for n, c in channels.items()}


def state(batch: int, heads: int, K: int, V: int) -> dict[str, CacheTensor]:
    return {"state": CacheTensor((batch, heads, K, V), "state", "state")}


def delta_core(K: int, V: int, C: int) -> float:
    """Chunked delta rule per value head per token: KKᵀ, QKᵀ, W (2CK each), U and A·U'
    (2CV each), the C×C unit-triangular inverse (C²/3), WS, QS, KᵀU' (2KV each):
    6CK + 4CV + C²/3 + 6KV (mixers.md §4(d), §5(d))."""
    return 6 * C * K + 4 * C * V + C * C / 3 + 6 * K * V


def decay_core(K: int, V: int, C: int) -> float:
    """Chunked linear attention with decay per head per token: QKᵀ (2CK), A·V (2CV),
    QS and KᵀV (2KV each): 2C(K + V) + 4KV (mixers.md §1(d), §2(d))."""
    return 2 * C * (K + V) + 4 * K * V
