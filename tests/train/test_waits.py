"""`data_loading(%)` is what the device waits for its batches: on a simulated device the loader's
host time behind the previous step's kernels is hidden, the copies and the loader's time on an
idle device are not, and evaluation before a step is no data wait; without CUDA, host time."""

from __future__ import annotations

import time

import torch

from lt2dsl.train.waits import DataWaits


class Device:
    """A stream: the host enqueues work that runs after what is queued and not before the host
    enqueued it; an event completes when the work queued before it has."""

    def __init__(self):
        self.host, self.free = 0.0, 0.0

    def work(self, seconds: float) -> None:
        self.free = max(self.free, self.host) + seconds

    def event(self):
        device = self

        class Event:
            def record(self):
                self.at = device.free = max(device.free, device.host)

            def elapsed_time(self, end) -> float:
                return 1e3 * (end.at - self.at)

        return Event()


def step(dev: Device, waits: DataWaits, loader_s: float, copy_s: float, kernels_s: float) -> None:
    waits.start()
    dev.host += loader_s  # reading batches on the host
    dev.work(copy_s)  # their copies, on the stream
    waits.ready()
    dev.work(kernels_s)  # the step's kernels; the host goes on at once


def test_the_device_waits_only_for_what_it_does_not_hide():
    dev = Device()
    waits = DataWaits(torch.device("cuda"), event=dev.event)
    step(dev, waits, 0.1, 0.01, 1.0)  # an idle device waits for the loader and the copy
    step(dev, waits, 0.1, 0.01, 1.0)  # behind the first step's kernels: only the copy
    dev.work(5.0)  # an evaluation between the steps
    dev.host = dev.free  # ... whose result the host reads
    step(dev, waits, 0.1, 0.01, 1.0)
    assert abs(waits.take() - (0.11 + 0.01 + 0.11)) < 1e-9
    step(dev, waits, 2.0, 0.01, 1.0)  # a loader slower than a step shows up in full
    assert abs(waits.take() - (2.0 - 1.01 + 0.01)) < 1e-9  # the device was 1.01 s behind
    assert waits.take() == 0.0


def test_without_cuda_the_wait_is_the_host_time():
    waits = DataWaits(torch.device("cpu"))
    waits.start()
    time.sleep(0.05)
    waits.ready()
    assert 0.04 < waits.take() < 1.0
    assert waits.take() == 0.0
