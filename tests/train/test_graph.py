"""`training.cuda_graph`: the step through static buffers (`train/graph.py`) gives the plain
trainer's losses bit for bit on the CPU, where a test's capture "replays" by calling the step on
the same buffers; graphs are captured once per shape after the warm-up and kept at most `KEEP`;
checkpoints resume across the two modes; incompatible options are errors naming the field. The
CUDA test (skipped without a GPU) captures for real."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lt2dsl.train import graph
from lt2dsl.train.config import validate
from lt2dsl.train.loader import Batch
from lt2dsl.train.loop import Trainer
from lt2dsl.train.loss import label_hits
from lt2dsl.train.optim import hold_lrs, tensor_lrs, update_mode
from lt2dsl.train.parallel import init_dist

from .helpers import config
from .test_tasks import CURRICULUM, curriculum_cfg

STEPS = 20
BASE = {
    "training": {"steps": STEPS, "batch_size": 4, "grad_accum": 2, "precision": "fp32", "indexer_loss": 0.0},
    "data": {"pack_documents": False},
    "optimizer": {"lr": 3e-3, "grad_clip": 0.05},  # clips every step of this run
    "scheduler": {"warmup_steps": 5},
}


class Replays:
    """A capture whose replay calls the captured step again on the same static buffers, on fresh
    gradients: what a CUDA graph does with the kernels it recorded (its backward, captured with
    the gradients None, writes them anew on every replay)."""

    def __init__(self, zero_grad=lambda: None):
        self.calls, self.zero_grad = 0, zero_grad

    def eager(self, fn):
        fn()

    def capture(self, fn):
        self.calls += 1

        def replay():
            self.zero_grad()
            fn()

        return replay


def train(cfg: dict, warmup: int = graph.WARMUP, resume=False):
    tr = Trainer(validate(cfg), init_dist("cpu"))
    if tr.graphs is not None:
        tr.graphs.capture, tr.graphs.warmup = Replays(tr.graphs.zero_grad), warmup
    return tr, tr.fit(resume, None)


def with_graph(cfg: dict, on: bool = True) -> dict:
    cfg["training"]["cuda_graph"] = on
    return cfg


def norms(result) -> list[float]:
    return [r["grad_norm"] for r in result.rows if "grad_norm" in r]


def test_the_static_step_gives_the_plain_losses_bit_for_bit(tmp_path):
    _, plain = train(config(tmp_path, "plain", **BASE))
    tr, graphed = train(with_graph(config(tmp_path, "graph", **BASE)))
    assert graphed.losses == plain.losses and len(plain.losses) == STEPS
    assert norms(graphed) == norms(plain) and max(norms(plain)) > 0.05  # clipped
    sig = ((2, 32), (2, 32))  # two micro-batches of 2 rows
    assert tr.graphs.captured == [(sig, sig)] and tr.graphs.capture.calls == 1
    assert tr.graphs.entries[(sig, sig)].eager_steps == graph.WARMUP  # then replays
    assert all(isinstance(g["lr"], torch.Tensor) and g["capturable"] is False for g in tr.opt.param_groups)


def test_a_curriculum_captures_each_length_once(tmp_path):
    _, plain = train(curriculum_cfg(tmp_path, "plain"))
    tr, graphed = train(with_graph(curriculum_cfg(tmp_path, "graph")), warmup=1)
    assert graphed.losses == plain.losses
    stages = [r["task/stage"] for r in graphed.rows if "task/stage" in r]
    assert stages == [r["task/stage"] for r in plain.rows if "task/stage" in r] and len(set(stages)) > 2
    lengths = [s[0][0][1] for s in tr.graphs.captured]
    assert len(lengths) == len(set(lengths)) >= 2 and lengths == sorted(lengths)
    assert len(tr.graphs.entries) <= graph.KEEP


def indexer_rows(result) -> list[float]:
    return [r["indexer_loss"] for r in result.rows if "indexer_loss" in r]


def test_the_indexer_loss_is_captured_with_the_step(tmp_path):
    """A `dsa` model training its indexer (weight 1): the static step's losses, gradient norms
    and logged `indexer_loss` are the plain trainer's bit for bit, the replayed steps' values
    coming from the step's own buffer (`IndexerLoss.take`), not from the hooks."""
    base = {**BASE, "training": {**BASE["training"], "indexer_loss": 1.0}}
    _, plain = train(config(tmp_path, "plain", **base))
    tr, graphed = train(with_graph(config(tmp_path, "graph", **base)))
    assert tr.graphs.captured and tr.tm.indexer is not None
    assert graphed.losses == plain.losses and norms(graphed) == norms(plain)
    kl = indexer_rows(plain)
    assert indexer_rows(graphed) == kl and len(kl) == STEPS and all(v > 0 for v in kl)
    # the replay's values come from the buffer: one per application and micro-batch, none kept
    assert tr.tm.indexer.kept == [] and tr.tm.indexer.taken == []


def test_the_learning_rate_stays_in_its_tensor():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], lr=0.5)
    lrs = tensor_lrs(opt, p.device)
    update_mode(opt, lrs, capturable=False)
    t = opt.param_groups[0]["lr"]
    assert t is lrs[0] and float(t) == 0.5
    opt.param_groups[0]["lr"] = 0.25  # a scheduler that assigns floats
    hold_lrs(opt, lrs)
    assert opt.param_groups[0]["lr"] is t and float(t) == 0.25
    update_mode(opt, None, capturable=False)  # back to floats (a plain run resuming)
    assert opt.param_groups[0]["lr"] == 0.25


def test_checkpoints_resume_across_the_two_modes(tmp_path):
    ckpt = {"enable": True, "interval": 10, "keep_latest_k": 0}
    _, plain = train(config(tmp_path, "plain", **BASE, checkpoint=ckpt))
    _, graphed = train(with_graph(config(tmp_path, "graph", **BASE, checkpoint=ckpt)))
    for saved, out, on in ((graphed, "to_plain", False), (plain, "to_graph", True)):
        at_10 = saved.out / "checkpoints" / "step-000010"
        _, resumed = train(with_graph(config(tmp_path, out, **BASE), on), resume=at_10)
        assert resumed.losses == {k: v for k, v in plain.losses.items() if k > 10}


def step_fn(batches, scale, total, hits, aux):
    for b in batches:
        total += b.input_ids.float().sum() * scale
        hits += (b.labels > 0).sum()
    return scale * 2


def test_graphs_capture_per_shape_and_keep_the_latest():
    captures = Replays()
    g = graph.Graphs(step_fn, lambda: None, captures, warmup=2, keep=2)
    order = [3, 3, 3, 3, 5, 5, 5, 7, 7, 7, 3, 3, 3, 3]  # 3 is dropped when 7 comes, so again
    for k, n in enumerate(order):
        ids = torch.arange(n * 2).reshape(1, 2 * n) + k
        loss, norm, hits, aux = g([Batch(ids[:, :n], ids[:, n:])], 0.5)
        assert float(loss) == float(ids[:, :n].sum()) * 0.5 and float(norm) == 1.0
        assert int(hits) == int((ids[:, n:] > 0).sum()) and aux.tolist() == [0.0, 0.0]
    assert [s[0][0][1] for s in g.captured] == [3, 5, 7, 3]
    assert [s[0][0][1] for s in g.entries] == [7, 3]


def test_packed_rows_run_eagerly():
    captures = Replays()
    g = graph.Graphs(step_fn, lambda: None, captures, warmup=0)
    ids = torch.arange(8).reshape(1, 8)
    for _ in range(3):
        g([Batch(ids, ids, torch.tensor([0, 3, 8], dtype=torch.int32))], 1.0)
    assert captures.calls == 0 and not g.entries


def test_dense_hits_count_what_the_sparse_count_counts():
    torch.manual_seed(0)
    h, w = torch.randn(3, 40, 8), torch.randn(11, 8)
    labels = torch.randint(0, 11, (3, 40))
    labels[torch.rand(3, 40) < 0.7] = -100
    sparse = label_hits(h, w, labels, chunk=16)
    assert int(label_hits(h, w, labels, chunk=16, dense=True)) == int(sparse) > 0


@pytest.mark.parametrize(
    "section, values, field",
    [
        ("training", {"compile": True}, "training.compile"),
        ("training", {"activation_checkpoint": "per_application"}, "training.activation_checkpoint"),
        ("data", {"pack_documents": True}, "data.pack_documents"),
    ],
)
def test_incompatible_options_name_the_field(tmp_path, section, values, field):
    cfg = with_graph(config(tmp_path, **BASE))
    cfg[section].update(values)
    with pytest.raises(ValueError, match=f"`{field}"):
        Trainer(validate(cfg), init_dist("cpu"))


def test_one_process_and_the_lm_objective_only():
    with pytest.raises(ValueError, match="one process"):
        graph.check_run(2, True)
    with pytest.raises(ValueError, match="objective"):
        graph.check_run(1, False)


# experiment (a)'s looped GDN (dim 256, 4 heads of 64) over bytes, looped twice
GPU_MODEL = Path(__file__).parents[2] / "examples" / "experiments" / "a_gdn.lt2"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def gpu_cfg(tmp_path, out: str, graphed: bool, **training) -> dict:
    cfg = config(tmp_path, out, **BASE)
    cfg["model"] = {"file": str(GPU_MODEL), "backend": "auto", "set": {"vocab": 256, "loop.T": 2}}
    cfg["data"]["seq_len"] = 64
    cfg["training"].update(device="cuda", cuda_graph=graphed, **training)
    return cfg


def fit_cuda(cfg: dict):
    tr = Trainer(validate(cfg), init_dist("cuda"))
    return tr, tr.fit(False, None)


@cuda
def test_cuda_graph_replays_the_eager_run(tmp_path):
    """bf16 on the Triton kernels: the graphed run's losses stay within bf16 noise of the eager
    run's, and the step is captured once (one shape)."""
    _, eager = fit_cuda(gpu_cfg(tmp_path, "plain", False, precision="bf16", steps=40))
    tr, graphed = fit_cuda(gpu_cfg(tmp_path, "graph", True, precision="bf16", steps=40))
    assert isinstance(tr.graphs.capture, graph.CudaCapture) and len(tr.graphs.captured) == 1
    assert tr.graphs.entries[tr.graphs.captured[0]].eager_steps == graph.WARMUP
    assert graphed.losses[1] == eager.losses[1]  # the same forward before any update
    for k in eager.losses:
        assert abs(graphed.losses[k] - eager.losses[k]) <= 0.03 * eager.losses[k], k
    assert graphed.losses[40] < graphed.losses[1]  # it trains


@cuda
def test_cuda_graph_captures_the_indexer_loss(tmp_path):
    """Experiment (a)'s DSA model training its indexer (weight 1), bf16 on the Triton kernels:
    captured once, the losses and the logged `indexer_loss` within bf16 noise of the eager run's
    (the replays' values come from the captured step's buffer), and both losses fall."""
    runs = []
    for out, on in (("plain", False), ("graph", True)):
        cfg = gpu_cfg(tmp_path, out, on, precision="bf16", steps=40, indexer_loss=1.0)
        cfg["model"]["file"] = str(GPU_MODEL.with_name("a_dsa.lt2"))
        runs.append(fit_cuda(cfg))
    (_, eager), (tr, graphed) = runs
    assert len(tr.graphs.captured) == 1 and tr.tm.indexer is not None
    assert graphed.losses[1] == eager.losses[1]
    for k in eager.losses:
        assert abs(graphed.losses[k] - eager.losses[k]) <= 0.03 * eager.losses[k], k
    kl = [indexer_rows(x) for x in (eager, graphed)]
    assert len(kl[0]) == len(kl[1]) == 40 and kl[1][0] == kl[0][0]
    assert all(math.isfinite(v) and v >= 0 for v in kl[1])
    # each replay writes its own values (a stale buffer would repeat the captured step's)
    assert len(set(kl[1][graph.WARMUP + 1 :])) > 30
    # one step's KL is noisy and the two runs round apart (H200: 0.088 vs 0.105 at step 40):
    # the last ten steps' means agree
    late = [sum(x[-10:]) / 10 for x in kl]
    assert abs(late[1] - late[0]) <= 0.3 * late[0]
    assert graphed.losses[40] < graphed.losses[1]


@cuda
def test_cuda_graph_follows_a_curriculum(tmp_path):
    """A curriculum (hits read after every step, a new length per stage): one capture per length
    that lasts past the warm-up, the first step's accuracy the eager run's."""
    cfgs = []
    for out, on in (("plain", False), ("graph", True)):
        cfg = gpu_cfg(tmp_path, out, on, precision="fp32", steps=30, batch_size=8, grad_accum=1)
        cfg["data"] = dict(CURRICULUM, max_stage=4)
        cfg["optimizer"] = {"lr": 1e-2, "weight_decay": 0.0}
        cfgs.append(cfg)
    _, eager = fit_cuda(cfgs[0])
    tr, graphed = fit_cuda(cfgs[1])
    accuracy = [next(r["task/accuracy"] for r in x.rows if "task/accuracy" in r) for x in (eager, graphed)]
    assert accuracy[0] == accuracy[1]
    lengths = [s[0][0][1] for s in tr.graphs.captured]
    assert lengths and lengths == sorted(set(lengths))
    assert all(math.isfinite(v) for v in graphed.losses.values()) and len(graphed.losses) == 30


class HostReads(TorchDispatchMode):
    """Records the ops that make the host wait for the device: a value read back (`item`,
    `bool(t)`), or an output shape that depends on the data (`nonzero`, boolean indexing)."""

    READS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique"})
    INDEXING = frozenset({"aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_"})

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in self.READS or (name in self.INDEXING and any(is_mask(i) for i in args[1])):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def is_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def test_the_step_reads_nothing_back_on_the_host(tmp_path, monkeypatch):
    """Forward, loss, hits, backward and clipping of the static step, on the CPU: no op that a
    CUDA graph capture would refuse (the CPU's AdamW reads its step count on the host, the
    capturable one on CUDA does not, so the update is left out here)."""
    cfg = with_graph(curriculum_cfg(tmp_path, "reads"))
    tr = Trainer(validate(cfg), init_dist("cpu"))
    batches = tr.data.train.next_step()
    static = graph.StaticStep.like(batches)
    static.load(batches, 0.5)
    monkeypatch.setattr(tr.opt, "step", lambda: None)
    with HostReads() as reads:
        tr._device_step(static.batches, static.scale, static.loss, static.hits)
    assert reads.seen == [] and float(static.loss) > 0
    with HostReads() as reads:  # the detector sees what the plain trainer's hits read
        label_hits(torch.randn(4, 8), torch.randn(5, 8), torch.tensor([0, -100, 3, 4]))
    assert "aten::nonzero" in reads.seen


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_the_indexer_loss_reads_nothing_back_on_the_host(tmp_path, monkeypatch, backend):
    """The step of a `dsa` model training its indexer (the KL hooks, `take` into the step's
    buffer), on the reference ops and on the Triton kernels (on the GPU, else interpreted): no host read
    that a capture would refuse, and the buffer holds one value per application."""
    # the Triton kernels run on the GPU where there is one, else in the interpreter
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    # one row of 16 tokens a micro-batch: the interpreter runs a program per query row
    training = {**BASE["training"], "batch_size": 2, "indexer_loss": 1.0, "device": device}
    data = {**BASE["data"], "seq_len": 16}
    cfg = with_graph(config(tmp_path, "reads", **{**BASE, "training": training, "data": data}))
    cfg["model"]["backend"] = backend
    tr = Trainer(validate(cfg), init_dist(device))
    batches = [b.to(torch.device(device)) for b in tr.data.train.next_step()]
    static = graph.StaticStep.like(batches)
    static.load(batches, 0.5)
    monkeypatch.setattr(tr.opt, "step", lambda: None)
    with HostReads() as reads:
        tr._device_step(static.batches, static.scale, static.loss, static.hits, static.aux)
    assert reads.seen == []
    kl, n = static.aux.tolist()
    assert n == 2 * 2 and kl > 0  # 2 micro-batches × the dsa layer's 2 applications (T=2)
