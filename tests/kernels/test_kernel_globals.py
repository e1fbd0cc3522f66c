"""Compiled Triton kernels may read a module-level global only when it is a `tl.constexpr`.

The CPU interpreter reads any Python global, so a plain `EPS = 1e-6` used inside a kernel passes
every CPU test and fails to compile on the GPU (it did: the fused conv + SiLU + L2-norm kernel on
the H200). This scans every kernel module's jitted functions for such reads.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import lt2dsl.kernels

ROOT = pathlib.Path(lt2dsl.kernels.__file__).parent


def _jitted(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        "jit" in ast.unparse(d) or ast.unparse(d) in ("helper", "device_fn") for d in node.decorator_list
    )


def plain_globals_read_by_kernels() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        plain = set()
        for n in tree.body:
            if isinstance(n, ast.Assign | ast.AnnAssign) and "constexpr" not in ast.unparse(n):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                plain |= {t.id for t in targets if isinstance(t, ast.Name)}
        for fn in filter(_jitted, tree.body):
            assigned = [t for x in ast.walk(fn) if isinstance(x, ast.Assign) for t in x.targets]
            local = {a.arg for a in fn.args.args} | {t.id for t in assigned if isinstance(t, ast.Name)}
            # the body only: decorators (autotune config lists) run on the host
            read = {x.id for stmt in fn.body for x in ast.walk(stmt) if isinstance(x, ast.Name)}
            names = sorted((read & plain) - local)
            bad += [f"{path.relative_to(ROOT)}: {fn.name} reads {name}" for name in names]
    return bad


def test_kernels_read_only_constexpr_globals():
    assert plain_globals_read_by_kernels() == []


def test_the_scan_finds_a_plain_global(tmp_path, monkeypatch):
    (tmp_path / "k.py").write_text("import triton\nEPS = 1e-6\n@triton.jit\ndef k(x):\n    y = x + EPS\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert plain_globals_read_by_kernels() == ["k.py: k reads EPS"]
