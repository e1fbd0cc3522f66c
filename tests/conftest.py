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


def pytest_addoption(parser):
    parser.addoption(
        "--gpu-triton",
        metavar="DIR",
        default=None,
        help="a `pip install --target` folder holding the GPU's Triton (`make gpu-triton`): the sm_90 "
        "compile check of every kernel (tests/kernels/test_aot.py) runs with it; skipped without",
    )


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A CUDA fault (illegal address, device-side assert) leaves the process's CUDA context unusable:
# every later test in it fails with the same error, hiding which tests are really wrong. After the
# failing test's report is out, an xdist worker exits so that xdist starts a fresh one; a plain
# pytest run stops with a message naming the test.
_CUDA_FAULTS = (
    "an illegal memory access was encountered",
    "device-side assert triggered",
    "unspecified launch failure",
    "misaligned address",
)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    if not (report.failed and report.longrepr is not None):
        return
    _log_failure_now(report)
    if getattr(report, "node", None) is not None:  # xdist controller: a worker's report, not ours
        return
    text = str(report.longrepr)
    if not any(f in text for f in _CUDA_FAULTS):
        return
    msg = f"CUDA context broken by {report.nodeid} ({report.when}); later tests would all fail"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import sys

        print(f"\n{msg}: restarting this worker", file=sys.stderr, flush=True)
        os._exit(3)
    pytest.exit(msg, returncode=1)


def _log_failure_now(report) -> None:
    """With LT2_FAIL_LOG set, append each failure's error lines to that file as it happens.

    The GPU runs are cut by a time limit, and pytest prints tracebacks only at the end; this keeps
    the reason of every failure that happened before the cut (bench/gpu_session.sh sets it).
    """
    path = os.environ.get("LT2_FAIL_LOG")
    # Written once per failure: by the xdist controller (a worker's report carries `node`) or by a
    # plain run; never by the workers themselves.
    from_worker = getattr(report, "node", None) is not None
    if not path or (not from_worker and os.environ.get("PYTEST_XDIST_WORKER")):
        return
    text = str(report.longrepr)
    errors = [ln for ln in text.splitlines() if ln.startswith("E ")][:12]
    with open(path, "a") as f:
        f.write(f"== {report.nodeid} ({report.when})\n" + "\n".join(errors or text.splitlines()[-12:]) + "\n")


# Full-size GPU tests (float64 references of 8k-token or 128k-cache problems) each hold tens of GiB
# of device memory; eight xdist workers running them at once ran the H200 out of memory, and the
# same tests passed two at a time. A test marked `gpu_heavy` waits for one of GPU_HEAVY_SLOTS
# machine-wide slots (file locks, so every worker process sees them).
GPU_HEAVY_SLOTS = int(os.environ.get("LT2_GPU_HEAVY_SLOTS", "2"))


@pytest.fixture(autouse=True)
def _gpu_heavy_slot(request):
    if request.node.get_closest_marker("gpu_heavy") is None or not _cuda_available():
        yield
        return
    with heavy_slot():
        yield
        import torch

        torch.cuda.empty_cache()  # hand the memory back before the next heavy test takes the slot


class heavy_slot:
    """Hold one of `slots` exclusive file locks in `folder`; waits (polling) until one is free."""

    def __init__(self, slots: int | None = None, folder: str | None = None, poll_s: float = 0.2):
        import tempfile

        self.slots = slots or GPU_HEAVY_SLOTS
        self.folder = folder or tempfile.gettempdir()
        self.poll_s = poll_s
        self.f = None

    def __enter__(self):
        import fcntl
        import time

        while True:
            for i in range(self.slots):
                f = open(os.path.join(self.folder, f"lt2dsl-gpu-heavy-{i}.lock"), "w")
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                self.f = f
                return self
            time.sleep(self.poll_s)

    def __exit__(self, *exc):
        import fcntl

        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
        self.f = None
        return False
