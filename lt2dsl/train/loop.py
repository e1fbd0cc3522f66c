"""The training loop: `run(cfg)` trains, evaluates, checkpoints and reports one run.

    from lt2dsl.train import TrainConfig, run
    result = run("runs/gdn_dsa.toml")          # or a TrainConfig, or a dict of sections
    result.losses[200], result.evals            # every step's loss; held-out loss by step

A step: read `grad_accum` micro-batches, count the labelled tokens of the whole step over all
processes, and for each micro-batch run the forward to the final hidden states, the chunked
cross-entropy summed over its tokens and the backward of (sum · processes / labelled tokens) —
the gradient of the step's mean loss once FSDP / DDP average it over processes, whatever the
split of rows. Then clip, step the optimizer and the schedule. A task source that observes (a
curriculum) is then told how many of the step's labelled tokens the model predicted right, over
all processes, before the next step's batch is drawn.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lt2dsl.train import checkpoint as ckpt
from lt2dsl.train import graph, indexer
from lt2dsl.train.build import build_data, build_model, shard_of
from lt2dsl.train.config import TrainConfig, load_config, validate
from lt2dsl.train.files import atomic_write
from lt2dsl.train.loader import IGNORE, Batch
from lt2dsl.train.metrics import Metrics, peak_flops, train_flops_per_token
from lt2dsl.train.objective import LMObjective, Objective
from lt2dsl.train.optim import build_optimizer, build_scheduler, hold_lrs, tensor_lrs, update_mode
from lt2dsl.train.parallel import Dist, TrainModel, init_dist, no_sync_unless, parallelize
from lt2dsl.train.plot import plot_metrics
from lt2dsl.train.waits import DataWaits


@dataclass
class RunResult:
    """What a run returns: every step's training loss, the held-out losses, the last checkpoint,
    the metric rows, the trained `LT2Model` (its parameters sharded under FSDP) and the task
    source (None for text data)."""

    out: Path
    losses: dict[int, float] = field(default_factory=dict)
    evals: dict[int, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    rows: list[dict] = field(default_factory=list)
    model: torch.nn.Module | None = None
    task: object | None = None


def run(
    cfg: TrainConfig | dict | str | Path,
    *,
    resume: bool | str | Path = False,
    on_step: Callable[[int, RunResult], None] | None = None,
    objective: Objective | None = None,
) -> RunResult:
    """Train one run (see the module docstring).

    Args:
        cfg: a `TrainConfig`, a dict of its sections, or the path of a TOML run file.
        resume (bool or path, Optional): True continues from the newest complete checkpoint of
            the run folder (starting afresh when there is none); a path names the checkpoint.
            Default: `False`.
        on_step (callable, Optional): called as `on_step(step, result)` after every step; a
            true return value ends the run after that step (no further evaluation or checkpoint).
        objective (Objective, Optional): what a step minimises and which weights train
            (`train/objective.py`). Default: the LM loss over every parameter.
    Raises:
        ValueError: a bad config or data, naming the field.
    """
    if isinstance(cfg, str | Path):
        cfg = load_config(cfg)
    elif isinstance(cfg, dict):
        cfg = validate(cfg)
    elif not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, a dict or a path, got {type(cfg).__name__}")
    owns_group = not torch.distributed.is_initialized()
    d = init_dist(cfg.training.device)
    try:
        return Trainer(cfg, d, objective).fit(resume, on_step)
    finally:
        if owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class Trainer:
    """One run's state; `fit` runs it."""

    def __init__(self, cfg: TrainConfig, d: Dist, objective: Objective | None = None):
        self.cfg, self.d, t = cfg, d, cfg.training
        graph.check_config(cfg)
        default_objective = objective is None
        objective = objective or LMObjective()
        self.out = t.out
        if d.main:
            self.out.mkdir(parents=True, exist_ok=True)
            atomic_write(self.out / "config.json", cfg.model_dump_json(indent=1))
        torch.manual_seed(t.seed)
        model = self.model = build_model(cfg)
        objective.prepare(model)
        # exp(held-out loss) is a perplexity for a next-token cross-entropy only
        self.perplexity = bool(getattr(objective, "perplexity", False))
        self.ir = model.ir
        self.shard = shard_of(cfg, d.world, d.rank)
        self.data = build_data(cfg, self.shard, model.config.vocab, d.main, d.barrier)
        checkpointed = t.activation_checkpoint == "per_application"
        keep = tuple(t.checkpoint_keep) if checkpointed else ()
        self.tm = TrainModel(model.to(d.device), checkpointed, fuse=cfg.model.fuse, keep=keep)
        self.tm.indexer = indexer.attach(model, t.indexer_loss, t.indexer_loss_keys, t.grad_accum)
        compile_backend = t.compile_backend if t.compile else None
        self.fwd = parallelize(
            self.tm, d, cfg.parallel, t.precision, compile_backend, t.loss_chunk, objective.loss_module
        )
        # a captured update reads its step count and learning rate on the device; eager steps of a
        # `cuda_graph` run use the same update, so the two kinds of steps agree
        self.capturable = t.cuda_graph and d.device.type == "cuda"
        self.opt = build_optimizer(self.tm, cfg.optimizer, self.capturable)
        self.sched = build_scheduler(self.opt, t.steps, cfg.scheduler)
        self.params = [p for p in self.tm.parameters() if p.requires_grad]
        self.lrs, self.graphs = None, None
        if t.cuda_graph:
            graph.check_run(d.world, default_objective)
            self.fwd.dense_hits = True  # no wait for the host inside the step
            self.lrs = tensor_lrs(self.opt, d.device)  # the scheduler keeps float base lrs
            zero = lambda: self.opt.zero_grad(set_to_none=True)  # noqa: E731
            self.graphs = graph.Graphs(self._device_step, zero, graph.capture_for(d.device))
        update_mode(self.opt, self.lrs, self.capturable)  # and again after a checkpoint loads
        self.state = ckpt.Stateful(self.tm, self.opt, self.sched, self.data.train)
        sharded_mp = d.world > 1 and cfg.parallel.strategy == "fsdp"
        # for what the objective runs beside the model (a distillation teacher); the model itself
        # runs on bf16 weight copies with autocast off (`TrainModel.cast`)
        self.autocast = t.precision == "bf16" and not sharded_mp
        self.ckpt_root = self.out / cfg.checkpoint.folder
        c = cfg.checkpoint
        self.saver = ckpt.Saver(self.ckpt_root, d, c.keep_latest_k, background=c.async_save)
        self.observes = bool(getattr(self.data.train, "observes", False))
        self.step_hits: torch.Tensor | None = None
        self.waits = DataWaits(d.device)  # what a step waits for its batches (`data_loading(%)`)

    # ---- the run --------------------------------------------------------------------------------

    def fit(self, resume, on_step) -> RunResult:
        result = RunResult(self.out, model=self.model, task=getattr(self.data.train, "source", None))
        step = self._resume(resume)
        metrics, window = self._metrics(), _Window()
        result.rows = metrics.rows  # the rows so far, for on_step
        with metrics:
            metrics.start_interval()
            try:
                while step < self.cfg.training.steps:
                    step += 1
                    self._step(step, window, metrics, result)
                    self._maybe_eval(step, metrics, result)
                    self._maybe_save(step, result)
                    if on_step is not None and on_step(step, result):
                        break
            finally:  # a checkpoint being written completes, also when the run fails after it
                self.saver.wait()
            self._flush(window.pending, result)  # the steps since the last row (a run ended early)
        if self.d.main and self.cfg.metrics.plot:
            plot_metrics(result.rows, self.out / "metrics.png", title=self.ir.config.name)
        return result

    def _metrics(self) -> Metrics:
        cfg, d = self.cfg, self.d
        hw, peak = peak_flops(d.device, cfg.training.precision, cfg.metrics.hardware)
        flops = train_flops_per_token(self.ir, self.data.seq_len)
        if d.main:
            self._write_estimate(hw, peak, flops)
        return Metrics(cfg.metrics, self.out, d.main, flops, peak, cfg.training.steps)

    def _step(self, step: int, window: _Window, metrics: Metrics, result: RunResult) -> None:
        """Read the step's batches, train on them, and log when the interval ends."""
        self.waits.start()
        host = self.data.train.next_step()
        labelled = sum(int((b.labels != IGNORE).sum()) for b in host)  # counted before the copy
        batches = [b.to(self.d.device) for b in host]
        self.waits.ready()
        loss_sum, count, grad_norm = self.train_step(batches, labelled)
        if self.observes:
            right = self.d.all_sum([float(self.step_hits)])[0]
            self.data.train.observe(int(right), count)
        local = sum(b.input_ids.numel() for b in batches)
        window.tokens += local
        self.tokens_seen += local * self.d.world
        window.pending.append((step, loss_sum, count))
        if step % self.cfg.metrics.log_interval and step != self.cfg.training.steps:
            return
        self._flush(window.pending, result)
        lr = float(self.opt.param_groups[0]["lr"])
        loss, norm = result.losses[step], _item(grad_norm)
        metrics.log(step, loss, norm, lr, window.tokens, self.waits.take(), self._extra())
        window.reset()

    def _extra(self) -> dict:
        """The row's task metrics, and the indexer's mean KL per token and application since the
        last row (`indexer_loss`, over all processes)."""
        extra = self.data.train.metrics() if self.observes else {}
        if self.tm.indexer is not None:
            total, n = self.d.all_sum(list(self.tm.indexer.pop()))
            extra["indexer_loss"] = total / max(n, 1.0)
        return extra

    def _write_estimate(self, hw: str, peak: float, flops: float) -> None:
        """`estimate.json`: what `lt2dsl.cost` predicts for this run (FLOPs per token, the peak
        MFU is taken against, memory per process), for comparing with the measured metrics."""
        from lt2dsl.cost.train_memory import train_memory

        t = self.cfg.training
        sharded = self.d.world if self.cfg.parallel.strategy == "fsdp" else 1
        act = "bf16" if t.precision == "bf16" else "fp32"
        keep = "attention" in t.checkpoint_keep
        mem = train_memory(self.ir, self.shard.micro, self.data.seq_len, sharded, t.loss_chunk, act, keep)
        out = {
            "hardware": hw,
            "peak_flops": peak,
            "train_flops_per_token": flops,
            "memory_bytes": mem.as_dict(),
        }
        atomic_write(self.out / "estimate.json", json.dumps(out, indent=1))

    def _resume(self, resume) -> int:
        """Load the checkpoint `resume` names (if any); then the optimizer in this run's update mode
        (the saving run's may differ, `optim.update_mode`), before any step or capture."""
        self.tokens_seen = 0
        step = 0
        folder = None if resume is False else ckpt.latest(self.ckpt_root) if resume is True else Path(resume)
        if folder is not None:
            # float lrs while loading: the loader's first optimizer step (`_init_optim_state`)
            # swaps a tensor lr for a CPU one, which a capturable update on CUDA is not meant to read
            update_mode(self.opt, None, self.capturable)
            state = ckpt.load(folder, self.state, self.d)
            self.tokens_seen = int(state["tokens_seen"])
            step = int(state["step"])
        update_mode(self.opt, self.lrs, self.capturable)
        return step

    def train_step(self, batches: list[Batch], labelled: int) -> tuple[torch.Tensor, int, torch.Tensor]:
        """One optimizer step over this process's micro-batches, which hold `labelled` tokens with a
        label; (loss sum, labelled tokens of the step over all processes, gradient norm before
        clipping). When the task source observes, `step_hits` holds this process's labelled
        tokens predicted right (before the update)."""
        count = int(self.d.all_sum([float(labelled)])[0])
        scale = self.d.world / max(count, 1)
        if self.graphs is not None:
            total, norm, hits, aux = self.graphs(batches, scale)  # static, replayed when captured
            if self.tm.indexer is not None:
                self.tm.indexer.record(aux)
        else:
            total = torch.zeros((), device=self.d.device)
            hits = torch.zeros((), dtype=torch.int64, device=self.d.device)
            norm = self._device_step(batches, scale, total, hits)
            self.opt.zero_grad(set_to_none=True)
        self.step_hits = hits if self.observes else None
        self.sched.step()
        if self.lrs is not None:
            hold_lrs(self.opt, self.lrs)
        return total, count, norm

    def _device_step(
        self,
        batches: list[Batch],
        scale,
        total: torch.Tensor,
        hits: torch.Tensor,
        aux: torch.Tensor | None = None,
    ):
        """Forward and backward of the micro-batches, scaled by `scale` (a float, or a device
        scalar under `cuda_graph`), the loss sum and hits accumulated into `total` and `hits`, the
        DSA indexer loss's (sum, count) moved into `aux` when given (`IndexerLoss.take`); then
        clipping and the update. Returns the gradient norm before clipping. Nothing here waits for
        the host, so `graph.Graphs` can capture it."""
        for m, b in enumerate(batches):
            with no_sync_unless(self.fwd, m == len(batches) - 1):
                loss = self._loss(b, self.observes)
                if self.observes:
                    loss, right = loss
                    hits += right
                (loss * scale).backward()
            total += loss.detach().float()
        if aux is not None and self.tm.indexer is not None:
            self.tm.indexer.take(aux)
        clip = self.cfg.optimizer.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip is not None else math.inf)
        self.opt.step()
        return norm

    def _loss(self, b: Batch, hits: bool = False):
        """The micro-batch's summed loss; with `hits`, (loss, labelled tokens predicted right)."""
        ctx = (
            # no cast cache under capture (the CUDA graph docs): a cached cast would outlive its step
            torch.autocast(self.d.device.type, dtype=torch.bfloat16, cache_enabled=self.graphs is None)
            if self.autocast
            else contextlib.nullcontext()
        )
        with ctx:
            if hits:
                return self.fwd(b.input_ids, b.labels, b.cu_seqlens, hits=True)
            return self.fwd(b.input_ids, b.labels, b.cu_seqlens)

    def _flush(self, pending: list, result: RunResult) -> None:
        """Read the pending steps' losses (one wait for the device) and sum them over processes."""
        sums = self.d.all_sum([float(s) for _, s, _ in pending])
        for (step, _, count), s in zip(pending, sums):
            result.losses[step] = s / max(count, 1)

    # ---- evaluation and checkpoints -------------------------------------------------------------

    def _maybe_eval(self, step: int, metrics: Metrics, result: RunResult) -> None:
        every = self.cfg.metrics.eval_interval
        due = step == self.cfg.training.steps or (every and step % every == 0)
        if self.data.val is None or not due:
            return
        result.evals[step] = self.evaluate()
        metrics.log_eval(step, result.evals[step], self.perplexity)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean held-out loss (nats per labelled token) over `metrics.eval_rows` fixed rows."""
        was = self.tm.training
        self.tm.eval()
        total, count = 0.0, 0
        try:
            for b in self.data.val.eval_batches(self.cfg.metrics.eval_rows):
                b = b.to(self.d.device)
                total += float(self._loss(b))
                count += int((b.labels != IGNORE).sum())
        finally:
            self.tm.train(was)
        total, count = self.d.all_sum([total, float(count)])
        return total / max(count, 1.0)

    def _maybe_save(self, step: int, result: RunResult) -> None:
        c = self.cfg.checkpoint
        last = step == self.cfg.training.steps
        if not c.enable or not (last or step % c.interval == 0):
            return
        result.checkpoint = self.saver.save(step, self.tokens_seen, self.state, final=last)


@dataclass
class _Window:
    """What accumulates between two metric rows: the steps whose losses are not yet read and the
    tokens this process ran."""

    pending: list = field(default_factory=list)
    tokens: int = 0

    def reset(self) -> None:
        self.pending, self.tokens = [], 0


def _item(x: torch.Tensor) -> float:
    full = getattr(x, "full_tensor", None)
    return float(full() if full is not None else x)


def read_metrics(out: Path) -> list[dict]:
    """The rows of a run's `metrics.jsonl`."""
    path = Path(out) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
