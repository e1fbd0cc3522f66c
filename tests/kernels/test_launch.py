"""`toeplitz/launch.py`: the kept autotuner pick and CompiledKernel give what Triton's own launch does."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from lt2dsl.kernels.common.backend import triton_interpreting
from lt2dsl.kernels.common.tiles import autotune_configs
from lt2dsl.kernels.toeplitz import launch as L

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    DEVICE == "cpu" and not triton_interpreting(), reason="needs a CUDA device or TRITON_INTERPRET=1"
)


@triton.jit
def _axpy(x, y, out, n, a, BLOCK: tl.constexpr, NEG: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    v = a * tl.load(x + o, mask=m, other=0.0) + tl.load(y + o, mask=m, other=0.0)
    if NEG:
        v = -v
    tl.store(out + o, v, mask=m)


# (one candidate under the interpreter, which cannot time any)
_tuned = triton.autotune(
    configs=autotune_configs([triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((32, 1), (64, 2))]),
    key=["n"],
)(_axpy)


def _run(kernel, x, y, a, neg=False, path="static"):
    n = x.numel()
    out = torch.full_like(x, float("nan"))
    kw = {"NEG": neg} if kernel is _tuned else {"BLOCK": 32, "NEG": neg}
    L.launch(kernel, lambda meta: (triton.cdiv(n, meta["BLOCK"]),), (n,), x, y, out, n, a, path=path, **kw)
    return out


def _unaligned(n: int) -> torch.Tensor:
    """A contiguous fp32 tensor whose address is 4 bytes past a 16-byte boundary."""
    return torch.randn(n + 1, device=DEVICE)[1:]


@pytest.mark.parametrize("path", ["static", "runner", "triton"])
@pytest.mark.parametrize("kernel", [_axpy, _tuned], ids=["jit", "autotuned"])
def test_every_specialization_launches_right(kernel, path):
    """Sizes 1 (Triton's `== 1` case), 16 (divisible) and 17, aligned and unaligned pointers,
    both constexpr values, each called twice: the second call of a key takes the kept kernel,
    launched by torch's static launcher or the CompiledKernel's runner."""
    L.clear()
    for n in (1, 16, 17, 100):
        for make in (lambda n: torch.randn(n, device=DEVICE), _unaligned):
            for neg in (False, True):
                for _ in range(2):
                    x, y = make(n), make(n)
                    out = _run(kernel, x, y, 0.5, neg, path)
                    ref = 0.5 * x + y
                    torch.testing.assert_close(out, -ref if neg else ref)


@pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter always takes Triton's own path")
def test_repeated_calls_take_the_fast_path():
    L.clear()
    x, y = torch.randn(100, device=DEVICE), torch.randn(100, device=DEVICE)
    _run(_tuned, x, y, 2.0)  # autotunes
    _run(_tuned, x, y, 2.0)  # compiles the kept kernel through Triton's own launch
    before = dict(L.COUNTS)
    for _ in range(3):
        out = _run(_tuned, x, y, 2.0)
    assert L.COUNTS["fast"] - before["fast"] == 3 and L.COUNTS["full"] == before["full"]
    if L._static_launcher() is not None:  # torch's C++ launcher took it
        assert L.COUNTS["static"] - before["static"] == 3
    torch.testing.assert_close(out, 2.0 * x + y)
    x1 = _unaligned(100)  # a new specialization: Triton's own path once
    _run(_tuned, x1, y, 2.0)
    assert L.COUNTS["full"] == before["full"] + 1
