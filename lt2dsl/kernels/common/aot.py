"""Ahead-of-time compile jobs: every Triton kernel at every config its launch code may pick.

The CPU tests run the kernels under Triton's interpreter, which accepts code the GPU's compiler
rejects and cannot tell whether a config fits. A `Job` names one compile of one kernel for sm_90:
its argument types, its constexprs and the (warps, stages) of one launch. Each kernel family lists
its jobs in its own `aot_jobs.py` (or `<family>_aot_jobs.py`), built from the launch code's own
autotuners (`tuned_jobs`: the autotuner's config list, with its `early_config_prune` applied to
the job's arguments) or from the fixed launch parameters the launch code computes; `all_jobs`
gathers them. `tests/kernels/aot_check.py` compiles them with the GPU's Triton (`make sm90`, and
`make test` through `tests/kernels/test_aot.py`).

The jobs need the GPU-mode kernel objects (real autotuners): they are built only with the
interpreter off.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lt2dsl.kernels.common.backend import triton_interpreting


@dataclass(frozen=True)
class Job:
    """One sm_90 compile of `kernel` (a `triton.jit` function).

    `types` gives every runtime argument's Triton type ("*bf16", "i32", "fp32", ...), `constexprs`
    every constexpr's value (and None for a runtime argument passed as None); the integer
    arguments in `aligned` compile as divisible by 16 (as the JIT specialises them at the usual
    sizes), pointers always do. `max_stack` bounds the spilled bytes per thread where a family
    keeps its spills in check (None: reported, not bounded).
    """

    name: str
    kernel: Any
    types: Mapping[str, str]
    constexprs: Mapping[str, Any]
    num_warps: int
    num_stages: int
    aligned: frozenset[str] = field(default_factory=frozenset)
    max_stack: int | None = None

    @property
    def kernel_name(self) -> str:
        return f"{self.kernel.fn.__module__}.{self.kernel.fn.__name__}"


def source(job: Job):
    """The `ASTSource` of a job, specialised as the JIT would (16-divisible pointers and `aligned`)."""
    from triton.compiler import ASTSource

    fn = job.kernel
    sig = {n: ("constexpr" if n in job.constexprs else job.types[n]) for n in fn.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if sig[n].startswith("*") or n in job.aligned
    }
    cex = {(fn.arg_names.index(k),): v for k, v in job.constexprs.items()}
    return ASTSource(fn=fn, signature=sig, constexprs=cex, attrs=attrs)


def signature(
    kernel, ptrs: Mapping[str, str], scalars: Mapping[str, str], constexprs: Mapping[str, Any], default: str
) -> dict:
    """Types of `kernel`'s runtime arguments (those not in `constexprs`): `scalars`, `ptrs`, else
    the `default` pointer type."""
    return {
        p.name: scalars.get(p.name, ptrs.get(p.name, default))
        for p in kernel.params
        if not p.is_constexpr and p.name not in constexprs
    }


def with_defaults(kernel, constexprs: Mapping[str, Any]) -> dict:
    """The constexprs of one compile of `kernel`: `constexprs` for its constexpr parameters (the
    others at their signature defaults; a KeyError names one left unset), and its runtime arguments
    that `constexprs` sets to None (as the JIT specialises an argument passed as None)."""
    out = {}
    for p in kernel.params:
        if p.name in constexprs and (p.is_constexpr or constexprs[p.name] is None):
            out[p.name] = constexprs[p.name]
        elif p.is_constexpr and p.default is not inspect.Parameter.empty:
            out[p.name] = p.default
        elif p.is_constexpr:
            raise KeyError(f"{kernel.fn.__name__}: no value for constexpr {p.name}")
    return out


def jit_of(kernel):
    """The `triton.jit` function of a kernel or of its autotuner."""
    from triton.runtime.autotuner import Autotuner

    return kernel.fn if isinstance(kernel, Autotuner) else kernel


def _aligned(kernel, names: Iterable[str]) -> frozenset[str]:
    """The integer arguments among `names` the JIT may specialise (not `do_not_specialize`)."""
    free = {p.name for p in kernel.params if not p.do_not_specialize}
    return frozenset(n for n in names if n in free)


def tuned_jobs(
    name: str,
    tuned,
    ptrs: Mapping[str, str],
    scalars: Mapping[str, str],
    constexprs: Mapping[str, Any],
    *,
    values: Mapping[str, Any] | None = None,
    launch: tuple[int, int] | None = None,
    aligned: Iterable[str] = ("T",),
    max_stack: int | None = None,
    default_ptr: str = "*fp32",
) -> list[Job]:
    """The jobs of one launch form of `tuned`: one per config of an autotuner that its pruner keeps
    for these constexprs (and the representative runtime `values` a pruner reads), or one at
    `launch` = (warps, stages) for a plain kernel. Pointer arguments missing from `ptrs` are
    `default_ptr`; runtime arguments `constexprs` sets to None are passed as None."""
    from triton.runtime.autotuner import Autotuner

    if triton_interpreting():
        raise RuntimeError("compile jobs need the GPU-mode kernels: unset TRITON_INTERPRET")
    if not isinstance(tuned, Autotuner):
        if launch is None:
            raise ValueError(f"{name}: a plain kernel's job needs its launch (warps, stages)")
        cex = with_defaults(tuned, constexprs)
        sig = signature(tuned, ptrs, scalars, cex, default_ptr)
        return [Job(name, tuned, sig, cex, launch[0], launch[1], _aligned(tuned, aligned), max_stack)]
    configs = list(getattr(tuned, "all_configs", tuned.configs))
    kept = configs
    prune = getattr(tuned, "early_config_prune", None)
    if prune is not None:
        kept = prune(configs, {**(values or {}), **constexprs})
    jobs = []
    for i, cfg in enumerate(configs):
        if not any(c is cfg for c in kept):
            continue
        cex = with_defaults(tuned.fn, {**constexprs, **cfg.kwargs})
        sig = signature(tuned.fn, ptrs, scalars, cex, default_ptr)
        align = _aligned(tuned.fn, aligned)
        jobs.append(Job(f"{name}-c{i}", tuned.fn, sig, cex, cfg.num_warps, cfg.num_stages, align, max_stack))
    return jobs


def job_modules(package: str = "lt2dsl.kernels") -> list[str]:
    """The modules of `package` that list a kernel family's compile jobs: `aot_jobs` and
    `*_aot_jobs`, each with a `jobs()` function."""
    pkg = importlib.import_module(package)
    names = [m.name for m in pkgutil.walk_packages(pkg.__path__, f"{package}.")]
    return sorted(n for n in names if n.rsplit(".", 1)[-1].endswith("aot_jobs"))


def all_jobs(modules: Iterable[str] | None = None) -> list[Job]:
    """Every family's jobs (of `modules`, default all `job_modules`); a ValueError names a job
    name used twice."""
    jobs: list[Job] = []
    for mod in job_modules() if modules is None else modules:
        jobs += importlib.import_module(mod).jobs()
    names = [j.name for j in jobs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"compile job names used twice: {dup[:5]}")
    return jobs


def jit_functions(package: str = "lt2dsl.kernels") -> list:
    """Every `triton.jit` function (kernel or helper) bound at module level in `package`, or inside
    a module-level autotuner, dict, list or tuple, in a stable order."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    pkg = importlib.import_module(package)
    found: dict[int, Any] = {}

    def visit(value, depth=0):
        if isinstance(value, Autotuner):
            visit(value.fn, depth)
        elif isinstance(value, JITFunction):
            found.setdefault(id(value), value)
        elif isinstance(value, dict) and depth < 2:
            for v in value.values():
                visit(v, depth + 1)
        elif isinstance(value, list | tuple) and depth < 2:
            for v in value:
                visit(v, depth + 1)

    for info in pkgutil.walk_packages(pkg.__path__, f"{package}."):
        for value in vars(importlib.import_module(info.name)).values():
            visit(value)
    return sorted(found.values(), key=lambda f: (f.fn.__module__, f.fn.__name__))


def referenced_functions(fn, candidates: Iterable) -> set[int]:
    """ids of the `candidates` (jit functions) that the source of `fn` (a jit function) names: the
    helpers it calls, or passes on (a `tl.reduce` combine function)."""
    by_id = {id(c): c for c in candidates}
    scope = fn.fn.__globals__
    out = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))):
        obj = None
        if isinstance(node, ast.Name):
            obj = scope.get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            obj = getattr(scope.get(node.value.id), node.attr, None)
        if id(obj) in by_id and obj is not fn:
            out.add(id(obj))
    return out


def kernels(functions: list) -> list:
    """The launchable kernels among `functions`: those no other jit function names (the rest are
    device helpers, compiled inside the kernels that call them)."""
    used: set[int] = set()
    for f in functions:
        used |= referenced_functions(f, functions)
    return [f for f in functions if id(f) not in used]


def uncovered(all_kernels: list, jobs: list[Job]) -> list[str]:
    """`module.name` of each kernel that no job compiles."""
    compiled = {id(j.kernel) for j in jobs}
    return [f"{k.fn.__module__}.{k.fn.__name__}" for k in all_kernels if id(k) not in compiled]
