"""Backend choice and argument checks shared by every op."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from lt2dsl.dtypes import SETTING_DTYPES, torch_dtype
from lt2dsl.env import poison, triton_interpreting

BACKENDS = ("reference", "triton", "auto")
# The dtypes every Triton kernel takes: the model-setting dtypes of the package's table (fp32, bf16,
# fp16); float64, the reference's truth, runs on `backend="reference"` only.
TRITON_DTYPES: tuple[torch.dtype, ...] = tuple(torch_dtype(n) for n in SETTING_DTYPES)


def triton_usable(device: torch.device) -> bool:
    """Can a Triton kernel run on tensors of this device?"""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and triton_interpreting()


def resolve_backend(backend: str, ref: torch.Tensor, has_triton: bool = True) -> str:
    """Map `backend` to "reference" or "triton" for tensors living where `ref` lives.

    "auto" picks Triton only on CUDA (the interpreter is for tests, not for speed); an explicit
    "triton" on a device it cannot use is an error rather than a silent fallback.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "reference":
        return "reference"
    if backend == "auto":
        return "triton" if has_triton and ref.device.type == "cuda" else "reference"
    if not has_triton:
        raise ValueError("this op has no Triton kernel yet; use backend='reference' or 'auto'")
    if not triton_usable(ref.device):
        raise ValueError(
            f"backend='triton' needs a CUDA tensor (or TRITON_INTERPRET=1 on CPU), got {ref.device}"
        )
    return "triton"


def pick_backend(backend: str, x: torch.Tensor) -> str:
    """ "reference" or "triton"; float64 has no Triton kernel ("auto" falls back, "triton" refuses)."""
    which = resolve_backend(backend, x)
    if which == "triton" and x.dtype == torch.float64:
        if backend == "auto":
            return "reference"
        raise ValueError(
            "backend='triton' supports float32, bfloat16 and float16; use 'reference' for float64"
        )
    return which


@dataclass(frozen=True)
class Dims:
    """Sizes of one call of a linear-attention op: batch B, time T, q/k heads H, value heads HV (a
    multiple of H: value head j reads q/k head j // (HV // H)), head dims K and V, sequences N."""

    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int | None], what: str) -> None:
    """Raise ValueError unless `t` has `len(expected)` dims matching `expected` (None = any).

    `what` spells the expected shape for the user, e.g. "[B, T, H, K]".
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"`{name}` must be a tensor of shape {what}, got {type(t).__name__}")
    ok = t.dim() == len(expected) and all(e is None or s == e for s, e in zip(t.shape, expected))
    if not ok:
        raise ValueError(f"`{name}` must have shape {what} = {_fmt(expected)}, got {list(t.shape)}")


def check_triton_dtype(*tensors: torch.Tensor | None) -> None:
    """Raise ValueError unless the given tensors (None skipped) share one dtype of `TRITON_DTYPES`."""
    dtypes = {t.dtype for t in tensors if t is not None}
    if len(dtypes) > 1 or not dtypes <= set(TRITON_DTYPES):
        got = "/".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        names = "/".join(str(d).removeprefix("torch.") for d in TRITON_DTYPES)
        raise ValueError(
            f"backend='triton' takes {names} inputs of one dtype, got {got}; use backend='reference'"
        )


def new_empty(like: torch.Tensor, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised kernel output or scratch buffer `shape` on `like`'s device, in `dtype` (default
    like's); NaN-filled under `LT2_POISON=1`, so an element a kernel forgets to write fails a test's
    comparison instead of passing on leftover memory."""
    t = like.new_empty(shape, dtype=like.dtype if dtype is None else dtype)
    return t.fill_(float("nan")) if t.is_floating_point() and poison() else t


def check_float(name: str, t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor, got {t.dtype}")


def _fmt(expected: Sequence[int | None]) -> str:
    return "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"


def keep_autotune_results() -> None:
    """Keep every autotuner's timings on disk, so a fresh process reuses the picks of an earlier one
    (e.g. of `lt2dsl warmup`) instead of timing each config on its first call.

    Triton's own cache does it (`triton.knobs.autotuning.cache`): one file per kernel, keyed by the
    Triton version, the GPU target, the kernel's source, the tuning key and the config list, in
    Triton's cache folder. An autotuner reads the switch when it is made, so this runs before any
    kernel module is imported (`lt2dsl/kernels/__init__.py`). A Triton without `knobs` times every
    first call as before.
    """
    try:
        import triton
    except ImportError:
        return
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        knobs.autotuning.cache = True


def autotuned_on_gpu(kernel, configs: Sequence, key: Sequence[str], keep=None):
    """`triton.autotune(configs, key)` of `kernel` for the GPU; None under the interpreter, where the
    caller launches the plain kernel with one fixed config.

    `keep(config, launch_args) -> bool` drops candidates for a launch before timing (a launch never
    ends up with none: a forced config is kept)."""
    if triton_interpreting():
        return None
    import triton

    by = None if keep is None else {"early_config_prune": config_pruner(keep)}
    return triton.autotune(configs=list(configs), key=list(key), prune_configs_by=by)(kernel)


def config_pruner(keep):
    """Triton's `early_config_prune` from `keep(config, launch_args)`; all of `cands` if none is kept
    (a config forced by `forced_autotune_config` still runs)."""

    def prune(cands, named_args, **kwargs):
        return [c for c in cands if keep(c, {**named_args, **kwargs})] or cands

    return prune


@contextmanager
def forced_autotune_config(tuned: Sequence, i: int) -> Iterator[None]:
    """Make each `triton.autotune`d kernel in `tuned` run config i of its list (modulo its length)
    only, with its cache cleared; restored on exit.

    For the GPU tests: every config a kernel may pick on the H200 is checked there (Hopper
    miscompiles are per config).
    """
    saved = [(t, t.configs, t.cache) for t in tuned]
    for t in tuned:
        t.configs, t.cache = [t.configs[i % len(t.configs)]], {}
    try:
        yield
    finally:
        for t, configs, cache in saved:
            t.configs, t.cache = configs, cache
