"""How long the device waits for a step's batches: the `data_loading(%)` of the metric rows.

The host runs ahead of the device (nothing reads a loss before the row's end), and the batches go
to the device as pinned, non-blocking copies (`Batch.to`) on the compute stream. So the host's time
in the loader is hidden behind the previous step's kernels unless the device catches up with it,
and the copy runs on the device, in stream order before the step's kernels. What a step waits for
is then the device's gap between reaching the step's start and having its batches: an event
recorded when the host starts reading the step's batches and one recorded once their copies are
issued; the time between the two on the device is the part of the loader's time the device did
not hide plus the copies themselves. Evaluation and checkpoints before the step's start are not
in it. Without CUDA the device is the host: the gap is the host's time from start to issued.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch


class DataWaits:
    """`start()` before reading a step's batches, `ready()` once they are on their way to the
    device; `take()` gives the seconds of the steps since the last `take()` (at a metric row,
    after the row's losses were read, so every event has completed)."""

    def __init__(self, device: torch.device, event: Callable[[], object] | None = None):
        if event is None and device.type == "cuda":
            event = functools.partial(torch.cuda.Event, enable_timing=True)
        self.event = event  # None: host time
        self.pairs: list[tuple] = []
        self.host_s = 0.0
        self._start = None

    def start(self) -> None:
        if self.event is None:
            self._start = time.perf_counter()
            return
        self._start = self.event()
        self._start.record()

    def ready(self) -> None:
        if self.event is None:
            self.host_s += time.perf_counter() - self._start
            return
        end = self.event()
        end.record()
        self.pairs.append((self._start, end))

    def take(self) -> float:
        if self.event is None:
            out, self.host_s = self.host_s, 0.0
            return out
        pairs, self.pairs = self.pairs, []
        return sum(a.elapsed_time(b) for a, b in pairs) / 1e3
