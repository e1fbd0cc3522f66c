"""Kernel launches with less host time: the autotuner's pick and the compiled kernel, kept.

`kernel[grid](...)` costs 34–44 µs of host time (BENCHMARKS.md, Toeplitz): the autotuner hashes
its key arguments, then the JIT binds and specializes every argument, builds its cache key, looks
it up, checks the globals the kernel read and launches. For an op whose GPU work is a few hundred
µs in three launches (the blocked Toeplitz mixer) that host time is the limit. `launch` does the
autotuner's pick once per caller key and keeps the `CompiledKernel` per argument specialization; a
later call with the same specialization skips Triton's binding and lookup and launches the kept
kernel directly (below).

The specialization key covers what Triton specializes on: each tensor's dtype and 16-byte
alignment, each integer's `== 1`, divisibility by 16 and 32/64-bit range, None and bools by value,
the constexpr keyword arguments by value, and the device. A call whose key is new takes the full
path once. Under the CPU interpreter every call takes the full path.

The kept kernel is launched, where it can be, by torch's static CUDA launcher (the C++ launcher
`torch.compile` uses for Triton kernels, `torch._C._StaticCudaLauncher`) on Triton's own loaded
function handle; where that launcher does not take the kernel (launch hooks, scratch memory,
cooperative or PDL launches, a torch without it) by the CompiledKernel's runner. The caller's
`path` (`ToeplitzRecipe.launch`) may ask for the runner, or for Triton's own launch every time.
"""

from __future__ import annotations

import torch
import triton
from triton.compiler.compiler import CompiledKernel

from ..common.backend import triton_interpreting

# a Triton whose CompiledKernel cannot be launched directly takes its own launch path every call
_KEEPS = hasattr(CompiledKernel, "__getitem__")

_Autotuner = triton.runtime.Autotuner
_INTERPRET = triton_interpreting()
_BEST: dict = {}
_COMPILED: dict = {}
# launches by path, for tests: "fast" (a kept CompiledKernel), "full" (Triton's own); "static"
# counts the kept kernels launched by torch's static launcher
COUNTS = {"fast": 0, "full": 0, "static": 0}
_I32 = 2**31


def _spec(args: tuple) -> tuple:
    return tuple(
        [
            (a.dtype, a.data_ptr() & 15 == 0)
            if isinstance(a, torch.Tensor)
            else (
                (a == 1, a & 15 == 0, -_I32 <= a < _I32)
                if type(a) is int
                else (a if a is None or type(a) is bool else type(a))
            )
            for a in args
        ]
    )


def _config(at, grid, key: tuple, args: tuple, kwargs: dict):
    """The config for this caller key, or None when this call ran the autotuner (and launched)."""
    if len(at.configs) == 1:
        return at.configs[0]  # pinned (`force_config`) or a single candidate
    cfg = _BEST.get((id(at), key))
    if cfg is None:
        at[grid](*args, **kwargs)
        _BEST[(id(at), key)] = at.best_config
    return cfg


def _tail(fn, n_args: int, kwargs: dict, meta: dict) -> tuple:
    """The values of the parameters after the positional ones, in signature order."""
    params = fn.signature.parameters
    out = []
    for name in fn.arg_names[n_args:]:
        if name in kwargs:
            out.append(kwargs[name])
        elif name in meta:
            out.append(meta[name])
        else:
            out.append(params[name].default)
    return tuple(out)


def _static_launcher():
    try:
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    except ImportError:
        try:
            from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel
        except ImportError:
            return None
    return StaticallyLaunchedCudaKernel


def _kept_positions(compiled) -> list[int]:
    """Indices of the arguments the compiled kernel takes (not constexpr, not specialized away),
    by the rule torch's static launcher builds its argument types with."""
    src = compiled.src
    names = src.fn.arg_names

    def index(k):
        return names.index(k) if isinstance(k, str) else (k[0] if isinstance(k, tuple) else k)

    sig = {index(k): v for k, v in src.signature.items()}
    const = {index(k) for k in getattr(src, "constants", {})}
    return [i for i in sorted(sig) if sig[i] != "constexpr" and i not in const]


def _runner(compiled, n_args: int, tail: tuple, path: str):
    """call(g3, args) launching the kept kernel: torch's static launcher where `path` asks for it
    and it takes the kernel, else the CompiledKernel's runner."""
    md = compiled.metadata
    cls = _static_launcher() if path == "static" else None
    if (
        cls is not None
        and not getattr(md, "launch_cooperative_grid", False)
        and not getattr(md, "launch_pdl", False)
    ):
        try:
            compiled._init_handles()
            if not hasattr(compiled, "_cubin_path"):
                compiled._cubin_path = None  # read by the launcher's constructor; we pass the handle
            sk = cls(compiled)
            sk.function = compiled.function
            keep = _kept_positions(compiled)
            if len(keep) != len(sk.arg_tys):
                raise ValueError("argument types do not match")
            head = [i for i in keep if i < n_args]
            rest = tuple(tail[i - n_args] for i in keep if i >= n_args)
            raw_stream = torch._C._cuda_getCurrentRawStream
            # the launcher's own `run`, minus its per-call checks: the scratch arguments it appends
            # (None: nothing to allocate, checked by its constructor) and one C++ call
            extra = (None,) * (int(sk.has_global_scratch) + int(sk.has_profile_scratch))
            tys = sk.arg_tys + "O" * len(extra)
            # (older torch: no `C_impl`, the CUDA launcher is torch._C's own)
            impl = sk.C_impl if hasattr(type(sk), "C_impl") else torch._C._StaticCudaLauncher
            c_launch, fn_h, warps, shared = impl._launch_kernel, sk.function, sk.num_warps, sk.shared

            def static(g3, dev, args):
                COUNTS["static"] += 1
                vals = (*[args[i] for i in head], *rest, *extra)
                c_launch(fn_h, g3[0], g3[1], g3[2], warps, shared, tys, vals, raw_stream(dev))

            return static
        except Exception:  # a kernel the static launcher does not take: the runner below
            pass

    def runner(g3, dev, args):
        compiled[g3](*args, *tail)

    return runner


def launch(kernel, grid, key: tuple, *args, path: str = "static", **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)` for a jitted or autotuned kernel, with less host time.

    `key` names the caller's shape class (what the autotuner's key arguments would): one pick per
    key. `grid` is a tuple or a callable of the meta-parameters (the keyword arguments and the
    config's). `path` is `ToeplitzRecipe.launch` ("static", "runner" or "triton"). A pinned
    config (`tiles.force_config`) is honoured."""
    at = kernel if isinstance(kernel, _Autotuner) else None
    if at is not None:
        cfg = _config(at, grid, key, args, kwargs)
        if cfg is None:
            COUNTS["full"] += 1
            return
        meta, opts, fn, cid = cfg.kwargs, cfg.all_kwargs(), at.fn, id(cfg)
    else:
        meta, opts, fn, cid = {}, {}, kernel, None
    g = grid({**kwargs, **meta}) if callable(grid) else grid
    if path == "triton" or _INTERPRET or not _KEEPS:
        COUNTS["full"] += 1
        fn[g](*args, **kwargs, **opts)
        return
    dev = torch.cuda.current_device()
    ck = (id(fn), key, cid, dev, path, _spec(args), tuple(kwargs.items()))
    call = _COMPILED.get(ck)
    if call is None:
        COUNTS["full"] += 1
        compiled = fn[g](*args, **kwargs, **opts)
        if isinstance(compiled, CompiledKernel):
            if len(_COMPILED) > 4096:
                _COMPILED.clear()
            _COMPILED[ck] = _runner(compiled, len(args), _tail(fn, len(args), kwargs, meta), path)
        return
    COUNTS["fast"] += 1
    call((g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1), dev, args)


def clear() -> None:
    """Forget the picks and compiled kernels (tests that swap a kernel's configs)."""
    _BEST.clear()
    _COMPILED.clear()


__all__ = ["clear", "launch"]
