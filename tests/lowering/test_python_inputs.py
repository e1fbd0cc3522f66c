"""Python entry points give clear errors and lose nothing: devices this machine lacks, the id
range under torch.compile without a graph break, pickling a lowered model at any time."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import lt2dsl

from .util import call, lower, tokens


@pytest.fixture(scope="module")
def model():
    return lower(f"{call('gdn')}; {call('swa')}", dtype=torch.float32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_cuda_on_a_machine_without_cuda():
    with pytest.raises(ValueError, match=r"device 'cuda' is not available on this machine.*device='cpu'"):
        lt2dsl.compile("dim = 64\ngdn\n", device="cuda")


def test_a_device_that_is_not_a_device():
    with pytest.raises(ValueError, match=r"device must be a torch\.device or a name"):
        lt2dsl.compile("dim = 64\ngdn\n", device="gpu0")


def test_torch_save_after_a_forward(model):
    """The traced graph is derived state: it is dropped when pickling and traced again."""
    ids = tokens(1, 5)
    want = model(ids)
    for clone in (_save_load(model), copy.deepcopy(model)):
        torch.testing.assert_close(clone(ids), want, rtol=0, atol=0)
        assert clone.graph_module is not model.graph_module
    assert model.__dict__["_graph_module"] is not None  # pickling left the original alone


def _save_load(m):
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_the_id_check_does_not_break_the_compiled_graph(model):
    ids = tokens(1, 5)
    want = model(ids)  # trace the FX graph outside dynamo, as a user's first call does
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend="eager")
    torch.testing.assert_close(compiled(ids), want)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    with pytest.raises(RuntimeError, match=r"token ids must be in \[0, 64\)"):
        compiled(torch.tensor([[1, 64, 2, 3, 4]]))
