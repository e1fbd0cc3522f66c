"""Test-wide setup: Triton's CPU interpreter where no GPU exists, the `gpu` marker, goldens."""

import os


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Must be set before any @triton.jit function is created: the decorator reads it.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # CI runs pytest-xdist with one worker per core: intra-op threads on top of that only fight
    # over the cores (tiny-tensor tests slowed down 20x with two threads per worker).
    import torch

    torch.set_num_threads(1)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
