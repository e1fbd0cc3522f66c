"""`custom_op`: plain eager calls skip the dispatcher; everything that can observe it does not."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from lt2dsl.kernels.common.custom_op import EagerOp, custom_op, dispatch_needed

CALLS = {"impl": 0}


@custom_op("lt2dsl_test::scaled_copy", mutates_args=())
def scaled_copy(x: torch.Tensor, s: float) -> torch.Tensor:
    CALLS["impl"] += 1
    return x * s


@scaled_copy.register_fake
def _(x, s):
    return torch.empty_like(x)


def _backward(ctx, dy):
    return dy * ctx.s, None


def _setup(ctx, inputs, output):
    ctx.s = inputs[1]


scaled_copy.register_autograd(_backward, setup_context=_setup)


class _Spy:
    """Counts the calls that go through the registered op."""

    def __init__(self, op):
        self.op, self.n = op, 0

    def __call__(self, *args, **kwargs):
        self.n += 1
        return self.op(*args, **kwargs)


def _spied(monkeypatch) -> _Spy:
    spy = _Spy(scaled_copy.op)
    monkeypatch.setattr(scaled_copy, "op", spy)
    return spy


def test_is_an_eager_op_with_the_registered_ops_attributes():
    assert isinstance(scaled_copy, EagerOp)
    # the registered op's attributes, through __getattr__
    assert scaled_copy._opoverload is torch.ops.lt2dsl_test.scaled_copy.default


def test_plain_eager_call_runs_the_implementation(monkeypatch):
    spy = _spied(monkeypatch)
    x = torch.randn(3)
    with torch.no_grad():
        y = scaled_copy(x, 2.0)
    torch.testing.assert_close(y, 2 * x)
    y = scaled_copy(x, 3.0)  # grad enabled, but nothing requires grad
    torch.testing.assert_close(y, 3 * x)
    assert spy.n == 0


def test_autograd_goes_through_the_op(monkeypatch):
    spy = _spied(monkeypatch)
    x = torch.randn(4, requires_grad=True)
    scaled_copy(x, 5.0).sum().backward()
    assert spy.n == 1
    torch.testing.assert_close(x.grad, torch.full_like(x, 5.0))
    with torch.no_grad():  # the same input without autograd: direct
        scaled_copy(x, 5.0)
    assert spy.n == 1


def test_flop_counter_fake_tensors_autocast_and_compile_dispatch():
    x = torch.randn(2, 3)
    assert not dispatch_needed((x, 1.0), {})
    with FlopCounterMode(display=False):
        assert dispatch_needed((x, 1.0), {})
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
    assert dispatch_needed((fake, 1.0), {})  # a tensor subclass, with or without its mode active
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert dispatch_needed((x, 1.0), {})
    assert dispatch_needed(([torch.randn(2, requires_grad=True)], 1.0), {})  # tensor lists too
    assert dispatch_needed((x,), {"w": torch.randn(2, requires_grad=True)})

    seen = set()

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    before = CALLS["impl"]
    out = torch.compile(lambda t: scaled_copy(t, 2.0), fullgraph=True, backend=backend)(x)
    torch.testing.assert_close(out, 2 * x)
    assert "lt2dsl_test.scaled_copy.default" in seen
    assert CALLS["impl"] > before
