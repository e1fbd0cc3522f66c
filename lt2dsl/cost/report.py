"""`Report`: the estimate as one structure, rendered as a table, JSON, CSV or Markdown."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _M(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BlockRow(_M):
    """One block (folded: per application, with `iterations`), or one (iteration, block)."""

    id: str
    kind: str
    label: str | None = None
    options: str  # the options that matter, as written in .lt2
    iterations: int  # applications per forward pass (product of enclosing loops' T)
    params_stored: int
    params_executed: int
    flops_prefill: float  # forward FLOPs per token, one application, mean over a prefill of L
    flops_decode: float  # forward FLOPs of one decode step at context L, one application
    flops_mixer_prefill: float
    flops_mixer_decode: float
    decode_bytes: float  # bytes moved per decoded token, one application, at batch B
    intensity: float  # flops_decode / decode_bytes
    bound: str  # "memory" | "compute" (decode, on the chosen hardware)
    state_bytes: int  # fixed-size state per sequence, one application
    kv_bytes: int  # growing caches per sequence at L, one application


class Params(_M):
    stored: int
    executed: int
    embedding: int
    embedding_share: float


class FlopsPerToken(_M):
    prefill: float
    decode: float
    train: float
    decode_expected: float | None = None  # with --exit-profile


class Memory(_M):
    weights_bytes: int
    state_bytes: int  # fixed-size states and conv buffers, whole batch
    kv_bytes: int  # caches that grow with L, at L, whole batch
    cache_bytes: int  # state + kv
    train_activations_bytes: int
    train_activations_recompute_bytes: int


class Roofline(_M):
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    ttft_s: float
    prefill_bound: str
    decode_bound: str
    decode_step_s: float  # max(compute, bytes) time + decode_launch_s
    decode_bytes_per_step: float
    # Kernels one decode step launches (`estimate.decode_kernels`) and their fixed cost on the card
    # (× its `kernel_s`; 0 on the datasheet presets, which do not model it).
    decode_kernels: int = 0
    decode_launch_s: float = 0.0
    # With --gen G: time to first token plus G decode steps (each at its own context length).
    generate_s: float | None = None


class Capacity(_M):
    max_batch: int  # largest batch whose cache fits at L next to the weights
    max_len: int | None  # largest L whose cache fits at batch B (None: no growing cache)
    max_len_note: str = ""


class Theory(_M):
    effective_depth: int
    receptive_field: int | None  # tokens; None = unbounded (whole prefix)
    update_rank: int | None  # per token span for looped delta rules; None when none loop


class Inputs(_M):
    model: str
    seq: int
    batch: int
    gen: int
    mode: str
    dtype: str
    state_dtype: str
    kv_dtype: str
    hw: str
    causal: str


class Report(_M):
    inputs: Inputs
    params: Params
    flops_per_token: FlopsPerToken
    memory: Memory
    roofline: Roofline
    capacity: Capacity
    theory: Theory
    blocks: list[BlockRow]
    extras: list[BlockRow]  # embedding, head, loop adapters and exit gates
    conventions: list[str]
