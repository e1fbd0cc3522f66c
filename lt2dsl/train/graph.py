"""Whole-step CUDA graphs (`training.cuda_graph`): a step's forward, backward, clipping and AdamW
update captured once per shape of its micro-batches, then replayed.

The small models of the task experiments are bound by the host: a step is thousands of tiny kernel
launches dispatched from Python. PyTorch's "whole network capture" (CUDA semantics docs) records
them once and replays them with one launch. A graph reads and writes fixed memory, so everything a
step takes or gives lives in a `StaticStep`: the micro-batches' `input_ids`/`labels`, the loss
scale `world / labelled` (a device scalar filled before each step), and the step's loss sum,
gradient norm, hits and DSA indexer-loss sum and count (read only where the trainer already waits
for the device). The optimizer state, the learning rate (a device tensor the scheduler's value is
filled into, `optim.hold_lrs`) and the parameters are the same tensors for every step.

`Graphs` runs a step through the `StaticStep` of its shape signature: the first `WARMUP` steps
of a shape run eagerly (they autotune the Triton kernels, make the optimizer state and every lazy
init), the next one is captured and then replayed once — capturing executes nothing, so no step is
skipped or run twice — and later steps of that shape replay. A new shape (the next curriculum
stage) warms up and captures again; at most `KEEP` graphs are kept, least recently used out, since
each holds a private memory pool of its shape's activations and gradients and a curriculum only
lengthens. Without CUDA nothing is captured and every step runs eagerly through the same static
buffers (what a test calls where the GPU would replay), the plain trainer's losses bit for bit.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lt2dsl.train.loader import Batch

WARMUP = 3  # eager steps of a shape before it is captured (the CUDA docs' warm-up iterations)
KEEP = 3  # graphs kept at once (each owns its shape's memory pool)

Signature = tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]


def check_config(cfg) -> None:
    """ValueError naming the field when `training.cuda_graph` meets an option a replay cannot
    honour (docs/train.md, "CUDA graphs")."""
    t = cfg.training
    if not t.cuda_graph:
        return
    if t.compile:
        raise ValueError(
            "`training.cuda_graph` and `training.compile` exclude each other: compile the blocks or "
            "capture the step, not both (torch.compile's own `mode='reduce-overhead'` is its graphs)"
        )
    if t.activation_checkpoint != "none":
        raise ValueError(
            "`training.cuda_graph` needs `training.activation_checkpoint = 'none'`: the recompute "
            "saves and restores the RNG state on the host, which a replay would not do"
        )
    if getattr(cfg.data, "pack_documents", False):
        raise ValueError(
            "`training.cuda_graph` needs `data.pack_documents = false`: packed rows carry new "
            "document bounds (`cu_seqlens`, read on the host) every step, so no graph would replay"
        )


def check_run(world: int, default_objective: bool) -> None:
    """The checks that need the built run: processes, the objective."""
    if world > 1:
        raise ValueError(
            f"`training.cuda_graph` runs on one process (got {world}): FSDP2's and DDP's "
            "communication runs from Python hooks and NCCL calls per step that a replay skips"
        )
    if not default_objective:
        raise ValueError("`training.cuda_graph` trains the LM objective only (not a custom `objective`)")


def signature(batches: list[Batch]) -> Signature | None:
    """The micro-batches' shapes; None for packed rows (their `cu_seqlens` change every step)."""
    if any(b.cu_seqlens is not None for b in batches):
        return None
    return tuple((tuple(b.input_ids.shape), tuple(b.labels.shape)) for b in batches)


@dataclass
class StaticStep:
    """The memory a step reads and writes: its micro-batches, the loss scale `[]` fp32, and the
    loss sum `[]` fp32, the gradient norm `[]` fp32, the hits `[]` int64 and the DSA indexer
    loss's (sum, count) `[2]` fp32 (`indexer.IndexerLoss.take`; zeros without `dsa`)."""

    batches: list[Batch]
    scale: torch.Tensor
    loss: torch.Tensor
    norm: torch.Tensor
    hits: torch.Tensor
    aux: torch.Tensor

    @classmethod
    def like(cls, batches: list[Batch]) -> StaticStep:
        device = batches[0].input_ids.device
        static = [Batch(b.input_ids.clone(), b.labels.clone(), b.cu_seqlens) for b in batches]

        def zero(dtype=torch.float32, shape=()):
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(static, zero(), zero(), zero(), zero(torch.int64), zero(shape=(2,)))

    def load(self, batches: list[Batch], scale: float) -> None:
        """Copy the step's micro-batches and scale into the static memory."""
        for s, b in zip(self.batches, batches, strict=True):
            s.input_ids.copy_(b.input_ids, non_blocking=True)
            s.labels.copy_(b.labels, non_blocking=True)
            s.cu_seqlens = b.cu_seqlens
        self.scale.fill_(scale)

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copies of (loss sum, gradient norm, hits, indexer (sum, count)): the next step
        overwrites the static ones."""
        return self.loss.clone(), self.norm.clone(), self.hits.clone(), self.aux.clone()


# `step(batches, scale, loss, hits, aux) -> grad norm`: forward and backward of the micro-batches
# with the loss scale, the loss sum and hits accumulated into `loss`/`hits`, the indexer loss's
# (sum, count) written into `aux`, clipping and the update
StepFn = Callable[[list[Batch], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class CudaCapture:
    """Eager steps and captures on one side stream (the CUDA docs' warm-up, so lazy per-stream
    state such as cuBLAS workspaces exists before capture); replays on the current stream."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device)

    def eager(self, fn: Callable[[], None]) -> None:
        here = torch.cuda.current_stream()
        self.stream.wait_stream(here)
        with torch.cuda.stream(self.stream), warnings.catch_warnings():
            # AdamW warns when a capturable update runs uncaptured: these steps do so by design
            warnings.filterwarnings("ignore", message=".*capturable=True.*")
            fn()
        here.wait_stream(self.stream)

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                fn()
        except RuntimeError as e:
            raise ValueError(
                f"`training.cuda_graph`: capturing the training step failed ({e}); something in the "
                "step waits for the host. Run with `training.cuda_graph = false`"
            ) from e
        return graph.replay


class NoCapture:
    """Without CUDA: every step eager, nothing captured."""

    def eager(self, fn: Callable[[], None]) -> None:
        fn()

    def capture(self, fn: Callable[[], None]) -> None:
        return None


@dataclass
class _Entry:
    static: StaticStep
    eager_steps: int = 0
    replay: Callable[[], None] | None = None
    tried: bool = False  # capture attempted (a `NoCapture` gives none)


class Graphs:
    """Runs steps through static buffers, captured per shape signature (module docstring).

    Args:
        step: the step's device work (`StepFn`); it must not wait for the host.
        zero_grad: sets the gradients to None (before an eager step or a capture: a captured
            backward then writes fresh gradients into its own memory).
        capture: `CudaCapture` on CUDA, `NoCapture` elsewhere (a test may pass its own).
    """

    def __init__(self, step: StepFn, zero_grad: Callable[[], None], capture, warmup=WARMUP, keep=KEEP):
        self.step, self.zero_grad, self.capture = step, zero_grad, capture
        self.warmup, self.keep = warmup, keep
        self.entries: OrderedDict[Signature, _Entry] = OrderedDict()
        self.captured: list[Signature] = []  # every capture, in order

    def __call__(self, batches: list[Batch], scale: float) -> tuple[torch.Tensor, ...]:
        """One step: (loss sum, gradient norm, hits, indexer (sum, count)), fresh tensors on the
        device."""
        sig = signature(batches)
        if sig is None:
            entry = _Entry(StaticStep.like(batches))  # packed rows: eager, never kept
        else:
            entry = self._entry(sig, batches)
        entry.static.load(batches, scale)
        run = self._runner(entry.static)
        if sig is not None and not entry.tried and entry.eager_steps >= self.warmup:
            entry.tried = True
            self.zero_grad()
            entry.replay = self.capture.capture(run)
            if entry.replay is not None:
                self.captured.append(sig)
        if entry.replay is not None:
            entry.replay()
        else:
            self.zero_grad()
            self.capture.eager(run)
            entry.eager_steps += 1
        return entry.static.outputs()

    def _entry(self, sig: Signature, batches: list[Batch]) -> _Entry:
        entry = self.entries.get(sig)
        if entry is None:
            entry = self.entries[sig] = _Entry(StaticStep.like(batches))
            while len(self.entries) > self.keep:
                self.entries.popitem(last=False)  # the graph and its memory pool go with it
        self.entries.move_to_end(sig)
        return entry

    def _runner(self, s: StaticStep) -> Callable[[], None]:
        def run() -> None:
            s.loss.zero_()
            s.hits.zero_()
            s.aux.zero_()
            s.norm.copy_(self.step(s.batches, s.scale, s.loss, s.hits, s.aux))

        return run


def capture_for(device: torch.device):
    """`CudaCapture` on a CUDA device, else `NoCapture`."""
    return CudaCapture(device) if device.type == "cuda" else NoCapture()
