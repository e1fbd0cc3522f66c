"""`common.grid_sync.barrier_counter`: one grow-only counter per (device, programs, barriers), since
a launch's base is its first read rounded down to barriers · programs, which holds only while every
launch on a counter adds the same; "cuda" and the current "cuda:N" name one device."""

from __future__ import annotations

import torch

from lt2dsl.kernels.common.grid_sync import barrier_counter
from tests.kernels.utils import DEVICE


def test_one_counter_per_grid_and_barrier_count():
    dev = torch.device(DEVICE)
    a = barrier_counter(dev, 7, 4)
    assert a is barrier_counter(dev, 7, 4)
    assert a.dtype == torch.int64 and a.numel() == 1 and a.device.type == dev.type
    others = [barrier_counter(dev, 8, 4), barrier_counter(dev, 7, 5)]
    assert all(o is not a for o in others) and others[0] is not others[1]
    if dev.type == "cuda":
        assert barrier_counter(torch.device("cuda", torch.cuda.current_device()), 7, 4) is a
