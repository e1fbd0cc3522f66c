"""Worker processes with a hang guard: each job runs in a child that is killed after `timeout`.

A job is `(kind, payload)`: `("cli", (argv, data))` runs `runner.run_cli`, `("run", text)` runs
`runner.run_model`. Workers are spawned (not forked: torch's threads do not survive a fork),
each with one intra-op thread, and reused until a job hangs; a hung worker is killed and
replaced, and its job is reported as `HANG`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any

HANG = "hang"
READY = "ready"


def _serve(conn: Connection) -> None:
    import torch

    from lt2dsl.fuzz import runner

    torch.set_num_threads(1)
    # Imports, the parser's tables and the lowering's modules take seconds on a loaded machine:
    # they are paid here, before READY, so that they never count against a job's timeout.
    import lt2dsl.lowering  # noqa: F401

    runner.run_cli(["check"], b"dim = 64\ngdn\n")
    conn.send(READY)
    while True:
        job = conn.recv()
        if job is None:
            return
        kind, payload = job
        if kind == "cli":
            argv, data = payload
            conn.send(runner.run_cli(argv, data))
        else:
            conn.send(runner.run_model(payload))


class Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.job: tuple[int, Any] | None = None
        self.since = 0.0
        if self.conn.recv() != READY:
            raise RuntimeError("a fuzz worker did not start")

    def submit(self, index: int, job: Any) -> None:
        self.job, self.since = (index, job), time.monotonic()
        self.conn.send(job)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()

    def close(self) -> None:
        if not self.proc.is_alive():
            return
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.kill()


def run_jobs(jobs: Iterable[Any], workers: int = 1, timeout: float = 30.0) -> Iterator[tuple[int, Any]]:
    """Yield `(index, result)` for every job, `HANG` for one that ran past `timeout` seconds
    (results arrive in completion order)."""
    ctx = mp.get_context("spawn")
    todo = list(enumerate(jobs))[::-1]
    pool = [Worker(ctx) for _ in range(max(1, min(workers, len(todo))))]
    try:
        while todo or any(w.job for w in pool):
            for w in pool:
                if w.job is None and todo:
                    w.submit(*todo.pop())
            busy = [w for w in pool if w.job is not None]
            deadline = min(w.since for w in busy) + timeout
            ready = wait([w.conn for w in busy], timeout=max(0.0, deadline - time.monotonic()))
            for w in busy:
                index = w.job[0]
                if w.conn in ready:
                    try:
                        result = w.conn.recv()
                        w.job = None
                    except EOFError:  # the interpreter itself died: report it, replace the worker
                        result = f"worker died with exit code {w.proc.exitcode}"
                        w.kill()
                        pool[pool.index(w)] = Worker(ctx)
                    yield index, result
                elif time.monotonic() - w.since > timeout:
                    w.kill()
                    w.job = None
                    if todo:  # a fresh worker only where jobs are left for it
                        pool[pool.index(w)] = Worker(ctx)
                    else:
                        pool.remove(w)
                    yield index, HANG
    finally:
        for w in pool:
            w.close()
