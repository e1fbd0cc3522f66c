"""The interpreter's language patching once per launch (`kernels.common.interpreter`)."""

import pytest
import torch
import triton
import triton.language as tl

from lt2dsl.env import triton_interpreting
from lt2dsl.kernels.common.interpreter import skip_nested_patching

pytestmark = pytest.mark.skipif(not triton_interpreting(), reason="the CPU interpreter's behaviour")


@triton.jit
def _twice(x):
    return x + x


@triton.jit
def _helper_kernel(X, Y, N: tl.constexpr, CALLS: tl.constexpr):
    i = tl.program_id(0)
    x = tl.load(X + i * N + tl.arange(0, N))
    for _ in tl.static_range(CALLS):
        x = _twice(x)
    tl.store(Y + i * N + tl.arange(0, N), tl.sum(x, 0) + x)


def test_a_launch_scans_the_language_once_however_many_helper_calls(monkeypatch):
    """Eight programs calling a helper once or three times each: the language modules are scanned
    for builtins as often either way (by the launch, not per call), the output is the kernel's,
    and the builtins are the language's own again once the launch ends."""
    from triton.runtime import interpreter as it

    assert skip_nested_patching()
    scans = []
    scan = it._patch_builtin
    monkeypatch.setattr(it, "_patch_builtin", lambda *a: (scans.append(a[0]), scan(*a))[1])
    x = torch.randn(8, 16)
    y = torch.empty_like(x)
    # a first launch settles the globals the interpreter adds to each function it rewrites
    _helper_kernel[(8,)](x, y, N=16, CALLS=1)
    counts = []
    for calls in (1, 3):
        scans.clear()
        _helper_kernel[(8,)](x, y, N=16, CALLS=calls)
        counts.append(len(scans))
        want = x * 2**calls
        torch.testing.assert_close(y, want.sum(1, keepdim=True) + want)
    assert counts[1] == counts[0] > 0, counts
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.core.tensor.__add__)


def test_a_failing_launch_leaves_no_launch_running(monkeypatch):
    """A launch that raises ends as a launch: a patch asked for outside any launch afterwards is a
    real one (were the failed launch still counted as running, it would be skipped), and the next
    launch computes the kernel's output."""
    from triton.runtime import interpreter as it

    assert skip_nested_patching()
    x = torch.randn(8, 16)
    with pytest.raises(Exception, match="power of 2"):
        _helper_kernel[(8,)](x, torch.empty_like(x), N=12, CALLS=1)  # tl.arange(0, 12)
    scans = []
    scan = it._patch_builtin
    monkeypatch.setattr(it, "_patch_builtin", lambda *a: (scans.append(a[0]), scan(*a))[1])
    it._patch_lang(_helper_kernel.fn).restore()
    assert scans
    y = torch.empty_like(x)
    _helper_kernel[(8,)](x, y, N=16, CALLS=1)
    torch.testing.assert_close(y, (2 * x).sum(1, keepdim=True) + 2 * x)
