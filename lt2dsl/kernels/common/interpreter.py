"""Triton's CPU interpreter (`TRITON_INTERPRET=1`, how CI runs every kernel) without its re-scans.

The interpreter maps `triton.language`'s builtins to its own semantics by patching the language
modules a kernel's globals hold: once when a launch starts (`GridExecutor`, undone when it ends)
and again at every device-function call of every program (`InterpretedFunction.__call__`), five
`inspect.getmembers` scans of the modules each time. Inside a launch those calls find the modules
patched already (a patched builtin is no longer a builtin, so the scan changes nothing), yet they
took a third of a DSA model's forward under the interpreter (15.5 of 45.8 s, cProfile).

`skip_nested_patching()` keeps the launch's patch and skips a device-function call's re-patch
when every language module its globals hold is one the running launch patched; any other call
(a module the launch did not patch, or no launch running) patches as before. What a program
computes is unchanged; only the redundant scans go.
"""

from __future__ import annotations

import inspect

_installed = False


def skip_nested_patching() -> bool:
    """Install the skip into Triton's interpreter (idempotent). False where this Triton's
    interpreter lacks the hooks it wraps (`_patch_lang`, `_LangPatchScope`, `GridExecutor`): it
    then runs as shipped."""
    global _installed
    if _installed:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter as it
    except ImportError:
        return False
    patch_lang = getattr(it, "_patch_lang", None)
    scope_type = getattr(it, "_LangPatchScope", None)
    executor = getattr(it, "GridExecutor", None)
    if patch_lang is None or scope_type is None or executor is None or not callable(executor.__call__):
        return False
    langs = (tl, tl.core)
    # one entry per running launch: the ids of the language modules it has patched
    running: list[set[int]] = []

    # the language modules of a globals dict, by (dict, size): the interpreter adds names to a
    # kernel's globals when it first rewrites it, and a module's dict keeps its identity
    seen: dict[tuple[int, int], set[int]] = {}

    def _langs_of(g: dict) -> set[int]:
        key = (id(g), len(g))
        if key not in seen:
            seen[key] = {id(v) for v in g.values() if inspect.ismodule(v) and any(v is m for m in langs)}
        return seen[key]

    def _patch_lang(fn):
        mine = _langs_of(fn.__globals__)
        if running and mine <= running[-1]:
            return scope_type()  # nothing patched, nothing to restore
        scope = patch_lang(fn)
        if running:
            running[-1] |= mine
        return scope

    launch = executor.__call__

    def __call__(self, *args, **kwargs):
        running.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            running.pop()

    it._patch_lang = _patch_lang
    executor.__call__ = __call__
    _installed = True
    return True
