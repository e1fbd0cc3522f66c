"""Shared pieces of the linear-recurrent specs: conv weights and caches, chunked core FLOPs, and
the formulas every kind with one (B, heads, K, V) state has in common."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import CacheTensor, Flops, FromAttention, LayerSpec, Mode, Opts, scaled
from lt2dsl.ir.specs.common import cat_width, conv_flops, from_attention, proj_flops

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


@dataclass(frozen=True)
class StateSpec(LayerSpec):
    """A kind whose decode cache is one fp32 state `[B, HS, K, V]` (HS: state heads) and whose
    FLOPs are its projections `proj` plus HS times `core`. Subclasses give `heads_dims` and `core`."""

    proj: ClassVar[tuple[str, ...]] = ()

    def heads_dims(self, o: Opts) -> tuple[int, int, int, int]:
        """(H, HS, K, V): q/k heads, state heads, key dim, value dim."""
        raise NotImplementedError

    def core(self, K: int, V: int, L: int, mode: Mode) -> float:
        """Core FLOPs per state head per token."""
        raise NotImplementedError

    def conv_channels(self, o: Opts) -> dict[str, int]:
        return {}

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """fp32 state (B, HS, K, V) + conv buffers: 4·HS·K·V + b·(W−1)·(2HK + HS·V) per sequence."""
        H, HS, K, V = self.heads_dims(o)
        return state(batch, HS, K, V) | conv_cache(self.conv_channels(o), o.get("conv", 0), batch)

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        H, HS, K, V = self.heads_dims(o)
        proj = proj_flops(self.weights(o, cfg), list(self.proj))
        if channels := self.conv_channels(o):
            proj += conv_flops(sum(channels.values()), o["conv"])
        return Flops(proj=proj, core=float(HS * self.core(K, V, L, mode)))


@dataclass(frozen=True)
class DeltaSpec(StateSpec):
    """A delta-rule kind (`deltanet`, `gdn`, `kda`): short convs on q, k and v, one state per
    value head, served by the delta-rule kernels."""

    def conv_channels(self, o: Opts) -> dict[str, int]:
        H, HV, K, V = self.heads_dims(o)
        return {"q": H * K, "k": H * K, "v": HV * V}

    # fp32 [T, HV, CHUNK] score matrices the chunk kernel saves for backward besides the inverse
    # (KDA's gated q·k scores)
    extra_scores: ClassVar[int] = 0
    # the projections that read the normed block input (fused into one GEMM)
    inputs: ClassVar[tuple[str, ...]] = ()

    def conv_kernels(self, o: Opts) -> int:
        """The short convs' decode launches: one fused step for q, k and v; SiLU on each without."""
        return 1 if o["conv"] else 3

    def is_delta_rule(self) -> bool:
        return True

    def gate_width(self, o: Opts) -> int:
        """fp32 decay-gate values per value head and token: 0 (none), 1 (scalar), K (per channel)."""
        return 0

    def chunk_saved(self, o: Opts) -> int:
        """Elements per token the delta-rule chunk op saves for backward (`kernels/delta/ops.py`,
        `_setup_context`), at 2 bytes an element (an fp32 value counts twice): q, k `[T, H, K]` and
        v, the corrected values `[T, HV, V]` in the compute dtype; fp32 β `[T, HV]`; with a decay,
        the fp32 gate and its chunk-cumulative sum `[T, HV, gate_width]`; the fp32 intra-chunk
        inverse `[T, HV, 64]` (and KDA's fp32 gated scores of that shape); the chunk states
        `[chunks, HV, K, V]`, one per 64-token chunk, in the compute dtype."""
        H, HV, K, V = self.heads_dims(o)
        states = -(-HV * K * V // CHUNK)
        scores = 2 * HV * CHUNK * (1 + self.extra_scores)
        return 2 * H * K + 2 * HV * V + 2 * HV + 4 * HV * self.gate_width(o) + scores + states

    def gate_saved(self, o: Opts) -> int:
        """Elements per token the kind's own gate computation keeps (beyond `chunk_saved`)."""
        return 0

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """The chunk op's tensors, the fused input projection's output (the short convs and the
        output gate read views of it), the output norm's input `[T, HV, V]`, the gate's own."""
        H, HV, K, V = self.heads_dims(o)
        proj = cat_width(self.weights(o, cfg), self.inputs)
        return self.chunk_saved(o) + proj + HV * V + self.gate_saved(o)


def gva_dims(o: Opts) -> tuple[int, int, int, int]:
    """(H, HV, K, V) of a delta rule with grouped value heads (`gdn`, `kda`): q/k heads, value
    heads, key dim, value dim = K · expand_v (fla's head_v_dim)."""
    return o["heads"], o["v_heads"], o["head_dim"], scaled(o["head_dim"], o.get("expand_v", 1))


@dataclass(frozen=True)
class GvaDeltaSpec(DeltaSpec):
    """A delta-rule kind with `v_heads` value heads over `heads` query/key heads (`gdn`, `kda`),
    one state per value head. A subclass gives `sub`, the size of its gated diagonal sub-chunks
    (0: none). Core per value head: chunked 6CK + 4CV + C²/3 + 6KV + 3·sub·K (mixers.md §5(d),
    §6(d)); decode 7KV. From attention: v and o at the value heads."""

    from_attention: Mapping[str, FromAttention] = field(
        default_factory=lambda: from_attention(v="v_heads", o="v_heads"), compare=False
    )
    sub: ClassVar[int] = 0

    def heads_dims(self, o: Opts) -> tuple[int, int, int, int]:
        return gva_dims(o)

    def core(self, K: int, V: int, L: int, mode: Mode) -> float:
        return 7 * K * V if mode == "decode" else delta_core(K, V, chunk_of(L)) + 3 * self.sub * K


@dataclass(frozen=True)
class DecaySpec(StateSpec):
    """Chunked linear attention with a decay and one state per head (`gla`, `retnet`). A subclass
    gives `dims(o) -> (H, K, V)` and `sub`, the size of the fp32 diagonal sub-blocks (0: none).
    Core per head: 2C(K+V) + 4KV + 3·sub·K chunked (mixers.md §2(d), §3(d)); decode 5KV."""

    sub: ClassVar[int] = 0

    @staticmethod
    def dims(o: Opts) -> tuple[int, int, int]:
        raise NotImplementedError

    def heads_dims(self, o: Opts) -> tuple[int, int, int, int]:
        H, K, V = self.dims(o)
        return H, H, K, V

    def core(self, K: int, V: int, L: int, mode: Mode) -> float:
        return 5 * K * V if mode == "decode" else decay_core(K, V, chunk_of(L)) + 3 * self.sub * K
