"""`training.compile`: each block's forward traces as one graph for unpacked rows (a graph break
fails the run) and trains as the eager model does; packed rows take a compilation that may break. The `eager`
backend traces the same graphs without code generation, which keeps the test in seconds."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import lt2dsl
from lt2dsl.train import run
from lt2dsl.train.parallel import compile_block

from .helpers import MODEL, config

STEPS = 3


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def losses(tmp_path, out: str, data: dict | None = None, **training) -> dict[int, float]:
    cfg = config(tmp_path, out, training={"steps": STEPS, **training}, metrics={"eval_rows": 4})
    if data is not None:
        cfg["data"] = data
    return run(cfg).losses


def test_unpacked_rows_compile_whole_and_train_as_eager(tmp_path):
    # the looped GDN + DSA model with its indexer loss; checkpointing recomputes each application
    task = {"task": "mqar", "vocab": 64, "length": 16, "num_kv_pairs": 2}
    kw = {"activation_checkpoint": "per_application"}
    eager = losses(tmp_path, "eager", task, **kw)
    compiled = losses(tmp_path, "compiled", task, compile=True, compile_backend="eager", **kw)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    assert compiled.keys() == eager.keys()
    for step, loss in eager.items():
        assert compiled[step] == pytest.approx(loss, rel=1e-6)


def test_packed_rows_take_a_compilation_that_may_break():
    torch.manual_seed(0)
    model = lt2dsl.compile(MODEL.format(tied="true"), backend="reference", dtype=torch.float32, fuse=False)
    block = model.blocks[0]  # gdn: the reference kernel loops over the documents on the host
    h = torch.randn(1, 24, 32)
    cu = torch.tensor([0, 5, 17, 24], dtype=torch.int32)
    with torch.no_grad():
        want = (block(h, None, 0, cu), block(h, None, 0, None))
        compile_block(block, "eager")
        got = block(h, None, 0, cu)
        assert counters["graph_break"], "packed rows should break the graph (cu_seqlens read on the host)"
        counters.clear()
        got_unpacked = block(h, None, 0, None)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch.testing.assert_close(got, want[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_unpacked, want[1], rtol=1e-6, atol=1e-6)
