"""`PassManager`: runs named passes in order, collects their diagnostics, reports who failed.

A pass is anything with a kebab-case `name` and `run(value) -> PassResult` (the `Pass`
protocol); `FunctionPass` makes one from a function. A pass that cannot give later passes what
they need says so with `PassResult.halt`, and the manager stops after it. A pass that raises is a
bug, not a problem with the input: the manager raises `InternalError` naming the pass and the
passes that ran before it, with the original exception as its cause (as torch.fx's
`PassManager` words it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from lt2dsl.diagnostics import Diagnostic

T = TypeVar("T")


@dataclass(frozen=True)
class PassResult(Generic[T]):
    """What a pass made of its input, what it reported, and whether later passes may run."""

    value: T
    diagnostics: tuple[Diagnostic, ...] = ()
    halt: bool = False


class Pass(Protocol[T]):
    name: str

    def run(self, value: T) -> PassResult[T]: ...


@dataclass(frozen=True)
class FunctionPass(Generic[T]):
    """A pass made of a name and a function `value -> PassResult`."""

    name: str
    fn: Callable[[T], PassResult[T]]

    def run(self, value: T) -> PassResult[T]:
        return self.fn(value)


class InternalError(RuntimeError):
    """A pass raised: `internal error in pass `resolve` after [`parse`, `overrides`]`."""

    def __init__(self, name: str, before: Sequence[str]):
        done = ", ".join(f"`{b}`" for b in before)
        super().__init__(f"internal error in pass `{name}` after [{done}]")
        self.pass_name, self.before = name, tuple(before)


# Called after each pass with its name, its time in seconds and the value it returned.
AfterPass = Callable[[str, float, object], None]


class PassManager(Generic[T]):
    def __init__(self, passes: Sequence[Pass[T]], after_pass: AfterPass | None = None):
        names = [p.name for p in passes]
        if len(set(names)) != len(names):
            raise ValueError(f"pass names must be unique, got {names}")
        self.passes, self.after_pass = tuple(passes), after_pass

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes)

    def run(self, value: T) -> PassResult[T]:
        """Run the passes on `value` until one halts; the last value with every diagnostic."""
        diags: list[Diagnostic] = []
        for i, p in enumerate(self.passes):
            t0 = time.perf_counter()
            try:
                result = p.run(value)
            except Exception as e:
                raise InternalError(p.name, self.names[:i]) from e
            value = result.value
            diags += result.diagnostics
            if self.after_pass is not None:
                self.after_pass(p.name, time.perf_counter() - t0, value)
            if result.halt:
                return PassResult(value, tuple(diags), halt=True)
        return PassResult(value, tuple(diags))
