"""Processes and sharding: the training forward, activation checkpointing, compile, FSDP2 / DDP.

`TrainModel` runs each block through its fused graph (`train/fused.py`) or eagerly; `parallelize`
then applies, in this order (torchtitan's `parallelize_llama`):

1. activation checkpointing: `TrainModel.run_block` keeps only each block application's input and
   recomputes the application in backward — a looped block is checkpointed once per iteration;
2. `torch.compile` of every block's `forward` (`compile_block`), after checkpointing, before
   sharding: the whole block as one graph (`fullgraph=True`) for unpacked rows, graph breaks
   allowed for packed ones (docs/train.md, "torch.compile");
3. under `torchrun` with more than one process, FSDP2 `fully_shard` with a `MixedPrecisionPolicy`:
   the embedding, then `[final_norm, lm_head]` as one unit that stays unsharded after forward
   (the loss reads the head right after the norm; tied embeddings and the final norm stay in
   the root unit instead), then every block (a block a loop reuses is one module, hence one unit,
   gathered again for each iteration), then the root — or DDP (`parallel.strategy = "ddp"`).
   Without FSDP, bf16 runs the forward on bf16 copies of the fp32 weights (`ParamCast`), as
   FSDP's `param_dtype` does.

The model is built whole on every process from the same seed and then sharded, so its initial
weights do not depend on the number of processes.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict
from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from lt2dsl.env import torchrun_ranks
from lt2dsl.lowering.model import LT2Model
from lt2dsl.lowering.to_fx import Unrolled
from lt2dsl.train.fused import fuse_blocks
from lt2dsl.train.loss import label_hits, linear_cross_entropy
from lt2dsl.train.precision import ParamCast

STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ParallelConfig(BaseModel):
    """More than one process (under `torchrun`); ignored by a single process."""

    model_config = STRICT

    strategy: Literal["fsdp", "ddp"] = "fsdp"
    """fsdp: FSDP2 `fully_shard` per block (weights, gradients, optimizer state sharded);
    ddp: every process holds the whole model (simple, more memory)."""
    reshard_after_forward: bool = True
    """FSDP: free a block's gathered weights after its forward (gathered again in backward)."""
    reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    """FSDP: dtype of the gradient reduce-scatter."""


@dataclass(frozen=True)
class Dist:
    """This process: `rank` of `world`, and its device."""

    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def all_sum(self, values: list[float]) -> list[float]:
        """Sum `values` over processes (float64 on the CPU for gloo, on the device for NCCL)."""
        if self.world == 1:
            return values
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()


def init_dist(device: str) -> Dist:
    """Join torchrun's process group (NCCL on CUDA, gloo on the CPU) when WORLD_SIZE > 1."""
    world, rank, local = torchrun_ranks()
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("training.device = 'cuda' but no CUDA device is available")
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Dist(rank, world, dev)


def kept_ops(keep: tuple[str, ...]) -> list:
    """The op overloads whose outputs selective checkpointing keeps for the names in `keep`:
    "attention" is every attention forward a mixer calls (softmax, window and compressed
    attention, DSA's and NSA's sparse attention). A ValueError for an unknown name."""
    if not keep:
        return []
    from lt2dsl.kernels.attention import ops as _attention  # noqa: F401 (registers the ops)
    from lt2dsl.kernels.dsa import ops as _dsa  # noqa: F401

    groups = {"attention": [torch.ops.lt2dsl.attn_fwd.default, torch.ops.lt2dsl.dsa_attn_fwd.default]}
    unknown = sorted(set(keep) - set(groups))
    if unknown:
        raise ValueError(f"checkpoint_keep: unknown {unknown}; expected names from {sorted(groups)}")
    return [op for name in dict.fromkeys(keep) for op in groups[name]]


class TrainModel(Unrolled):
    """The training forward: `LT2Model`'s modules called one by one (so FSDP's per-module hooks and
    checkpointing see every block application), returning the final hidden states `[B, T, D]`
    for the chunked loss. Parameter names are `LT2Model`'s.

    With `fuse`, every block runs the lowering's fused graph of itself (`train/fused.py`; the
    model's blocks become `FusedBlock`s); without, the blocks' modules run eagerly, as written
    (what a forward hook on a mixer needs to fire; fused blocks become plain ones again).
    """

    def __init__(
        self, model: LT2Model, checkpoint_blocks: bool = False, fuse: bool = False, keep: tuple[str, ...] = ()
    ):
        head = getattr(model, "lm_head", None)
        fuse_blocks(model.blocks, fuse)
        super().__init__(model.ir, model.embed, model.blocks, model.loops, model.final_norm, head, head=False)
        self.checkpoint_blocks = checkpoint_blocks
        # selective checkpointing: these ops' outputs are saved in the forward and handed back to
        # the recompute instead of running again (`training.checkpoint_keep`)
        kept = kept_ops(keep)
        self.checkpoint_context = (
            functools.partial(create_selective_checkpoint_contexts, kept) if kept else None
        )
        self.tied = model.config.tie_embeddings
        self.indexer = None  # the DSA indexer's loss hooks (`train/indexer.py`)
        self.cast: ParamCast | None = None  # bf16 weight copies without FSDP (`train/precision.py`)

    def forward(self, input_ids: torch.Tensor, cache=None, cu_seqlens=None) -> torch.Tensor:
        with contextlib.ExitStack() as scope:
            if self.cast is not None:
                # the weights are bf16 already; autocast would widen the ops it keeps in fp32
                scope.enter_context(torch.autocast(input_ids.device.type, enabled=False))
                scope.enter_context(self.cast.forward())
            if self.indexer is None:
                return super().forward(input_ids, cache, cu_seqlens)
            self.indexer.begin()
            out = super().forward(input_ids, cache, cu_seqlens)
            self.indexer.end()
            return out

    def run_block(self, i: int, h: torch.Tensor, app: int, run: tuple) -> torch.Tensor:
        if self.checkpoint_blocks and torch.is_grad_enabled():
            kw = {} if self.checkpoint_context is None else {"context_fn": self.checkpoint_context}
            return checkpoint(super().run_block, i, h, app, run, use_reentrant=False, **kw)
        return super().run_block(i, h, app, run)

    def head_weight(self) -> torch.Tensor:
        """`[vocab, D]`: the LM head, or the embedding when tied."""
        return self.embed.weight if self.tied else self.lm_head.weight


class WithLoss(nn.Module):
    """`(input_ids, labels, cu_seqlens) -> summed cross-entropy`: the forward and the chunked loss
    in one module call, so DDP sees the head weight used inside its forward. With `hits=True` it
    returns (loss, labelled tokens predicted right) from the same hidden states (`label_hits`;
    `dense_hits` counts without waiting for the host, for a captured step)."""

    def __init__(self, tm: TrainModel, chunk: int, dtype: torch.dtype):
        super().__init__()
        self.tm, self.chunk, self.dtype = tm, chunk, dtype
        self.dense_hits = False

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, cu_seqlens=None, hits: bool = False):
        h = self.tm(input_ids, None, cu_seqlens)
        w = self.tm.head_weight()
        loss = linear_cross_entropy(h, w, labels, self.chunk, self.dtype)
        if not hits:
            return loss
        return loss, label_hits(h.detach(), w.detach(), labels, self.chunk, self.dtype, self.dense_hits)


def parallelize(
    tm: TrainModel,
    d: Dist,
    pcfg: ParallelConfig,
    precision: str,
    compile_backend: str | None,
    chunk: int,
    make_loss=WithLoss,
):
    """Compile (with `compile_backend`, None for eager) and shard `tm` (module docstring); returns
    the loss module to call (wrapped in DDP for that strategy): `make_loss(tm, chunk, dtype)`, the
    LM loss `WithLoss` unless an objective (`train/objective.py`) gives another."""
    if compile_backend is not None:
        # Every block runs one code object (its class's forward): each block structure, grad mode
        # (training, evaluation) and input shape is an entry of that one cache, and with fullgraph
        # running out of entries is an error, so the limit grows with the blocks (a global setting).
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, 8 * len(tm.blocks))
        for block in tm.blocks:
            compile_block(block, compile_backend)
    sharded = d.world > 1 and pcfg.strategy == "fsdp"
    if precision == "bf16" and not sharded:
        tm.cast = ParamCast(tm, torch.bfloat16)  # FSDP's param dtype, without FSDP
    fwd = make_loss(tm, chunk, torch.bfloat16 if precision == "bf16" else torch.float32)
    if d.world == 1:
        return fwd
    if pcfg.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [d.device.index] if d.device.type == "cuda" else None
        # every trained parameter has a gradient: the DSA indexers from their KL (`indexer.py`)
        # hung on the forward's output, or frozen when it is off
        return DDP(fwd, device_ids=ids)
    _fully_shard(tm, d, pcfg, precision)
    return fwd


def compile_block(block: nn.Module, backend: str = "inductor") -> None:
    """Compile `block.forward(h, entry, pos, cu_seqlens)`: fullgraph when `cu_seqlens` is None.

    Unpacked rows trace as one graph (a graph break is an error, not a silent slowdown); packed
    rows take a second compilation that may break, since the reference kernels loop over the
    documents of `cu_seqlens` on the host. Only `forward` is compiled, so the hooks on the block
    itself (FSDP2's, which dynamo does not trace) stay eager around it, while the hooks of its
    submodules (the DSA indexer loss) are traced with it.
    """
    eager = block.forward
    whole = torch.compile(eager, fullgraph=True, backend=backend)
    broken = torch.compile(eager, backend=backend)

    def forward(h, entry=None, pos=0, cu_seqlens=None):
        return (whole if cu_seqlens is None else broken)(h, entry, pos, cu_seqlens)

    block.forward = forward


def _fully_shard(tm: TrainModel, d: Dist, pcfg: ParallelConfig, precision: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(d.device.type, (d.world,))
    bf16 = precision == "bf16"
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None,
        reduce_dtype=torch.bfloat16 if pcfg.reduce_dtype == "bf16" else torch.float32,
    )
    kw = {"mesh": mesh, "mp_policy": mp}
    # A unit reduces its gradients after the backward of its own forward; the tied embedding's
    # last gradient arrives only at the very end, so it and the final norm stay in the root unit.
    if not tm.tied:
        fully_shard(tm.embed, reshard_after_forward=pcfg.reshard_after_forward, **kw)
        fully_shard([tm.final_norm, tm.lm_head], reshard_after_forward=False, **kw)
    for block in tm.blocks:
        fully_shard(block, reshard_after_forward=pcfg.reshard_after_forward, **kw)
    # the root's weights are used again as soon as backward starts
    fully_shard(tm, reshard_after_forward=False, **kw)


def no_sync_unless(module, last: bool):
    """DDP: skip the gradient all-reduce of all but the last micro-batch of a step (DDP holds
    whole gradients anyway). FSDP reduce-scatters every micro-batch: keeping unsharded gradients
    until the last one would hold a whole model's fp32 gradients on every process."""
    if last or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()
