"""The `gpu_heavy` slots: at most N holders at once, across processes."""

from __future__ import annotations

import multiprocessing as mp
import time

from tests.conftest import heavy_slot


def _hold(folder: str, slots: int, seconds: float, q) -> None:
    with heavy_slot(slots, folder, poll_s=0.01):
        q.put(("in", time.monotonic()))
        time.sleep(seconds)
        q.put(("out", time.monotonic()))


def test_at_most_n_holders_across_processes(tmp_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_hold, args=(str(tmp_path), 2, 0.3, q)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    events = sorted((q.get() for _ in range(8)), key=lambda e: e[1])
    held, peak = 0, 0
    for kind, _ in events:
        held += 1 if kind == "in" else -1
        peak = max(peak, held)
    assert peak == 2


def test_a_slot_is_free_again_after_exit(tmp_path):
    with heavy_slot(1, str(tmp_path)):
        pass
    with heavy_slot(1, str(tmp_path), poll_s=0.01):  # would wait forever if the lock had leaked
        pass
