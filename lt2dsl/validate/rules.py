"""The rule registry: every diagnostic code, its check function and its documentation.

A rule is a function `check_<thing>(ctx) -> Iterator[Diagnostic]` decorated with `@rule(code)`.
Its docstring is the rule's page (`lt2dsl explain CODE`, the docs catalogue): a one-line title,
then the sections *What it checks*, *Why it matters*, *Example* and *Use instead*, each a header
line ending in `:` followed by an indented block. Codes are stable; the letter is the severity
(E error, W warning), the first two digits the topic: 00 syntax, 01 names, 02 values,
03 structure, 04 kernels, 05 shapes, 09 the driver, 10 checkpoint import, 99 internal errors.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import import_module

from lt2dsl.diagnostics import Diagnostic

SECTIONS = ("What it checks", "Why it matters", "Example", "Use instead")
TOPICS = {
    "00": "syntax",
    "01": "names",
    "02": "values",
    "03": "structure",
    "04": "kernels",
    "05": "shapes",
    "09": "driver",
    "10": "import",
    "99": "internal",
}
# Modules whose import registers rules (docs and `explain` need all of them).
RULE_MODULES = (
    "lt2dsl.validate.names",
    "lt2dsl.validate.values",
    "lt2dsl.validate.limits",
    "lt2dsl.validate.structure",
    "lt2dsl.validate.shapes",
    "lt2dsl.validate.kernels",
    "lt2dsl.validate.checkpoints",
    "lt2dsl.frontend",
    "lt2dsl.passes.overrides",
    "lt2dsl.cli",
)


@dataclass(frozen=True)
class Rule:
    code: str
    title: str
    sections: dict[str, str]
    func: Callable[..., Iterator[Diagnostic]] | None = field(compare=False, default=None)

    @property
    def severity(self) -> str:
        return "warning" if self.code.startswith("W") else "error"

    @property
    def topic(self) -> str:
        return TOPICS.get(self.code[1:3], "other")


RULES: dict[str, Rule] = {}
CODE = re.compile(r"^[EW]\d{4}$")


def rule(code: str):
    """Register `func` as the check that owns `code`; its docstring documents the code."""

    def register(func):
        assert CODE.match(code), f"bad diagnostic code {code!r}"
        assert code not in RULES, f"diagnostic code {code} registered twice"
        title, sections = parse_doc(func.__doc__ or "")
        RULES[code] = Rule(code=code, title=title, sections=sections, func=func)
        func.code = code
        return func

    return register


def parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    """(title, {section: text}) of a ruff-style rule docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    title = lines[0].rstrip(".") if lines else ""
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines[1:]:
        if line.rstrip(":") in SECTIONS and line.endswith(":"):
            current = sections.setdefault(line[:-1], [])
        elif current is not None:
            current.append(line[4:] if line.startswith("    ") else line.strip())
    return title, {k: "\n".join(v).strip("\n") for k, v in sections.items()}


def all_rules() -> dict[str, Rule]:
    """Every code: the check rules plus the syntax catalogue, sorted by code."""
    from lt2dsl.grammar.syntax_errors import ALL

    for m in RULE_MODULES:
        import_module(m)
    out = dict(RULES)
    for r in ALL:
        out[r.code] = Rule(
            code=r.code,
            title=r.title[0].upper() + r.title[1:],
            sections={
                "What it checks": "The text is not valid `.lt2` syntax at this point; the message reads: "
                + r.message.replace("{found}", "…")
                .replace("{expected}", "…")
                .replace("{{", "{")
                .replace("}}", "}")
                + ".",
                "Why it matters": r.why,
                "Example": r.examples[0] if r.examples else "",
                "Use instead": r.fixed,
            },
        )
    return dict(sorted(out.items()))
