"""The reference half of `docs/language.md`, generated from the spec objects and rule docstrings.

`docs/language.md` is a hand-written introduction, then a marker line, then the output of
`generate()`: model settings, loop options, every layer kind with its options, defaults and
ranges, channel mixers and norms, and every diagnostic code with its example. Regenerate with
`python -m lt2dsl.docs` (a test fails when the file is stale). `explain(code)` is one code's page
as plain text (`lt2dsl explain E0101`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from lt2dsl.ir.printer import size
from lt2dsl.ir.registry import REGISTRY
from lt2dsl.ir.settings import EXIT_GATE_OPTIONS, MODEL_SETTINGS
from lt2dsl.ir.spec import Option
from lt2dsl.ir.specs.channel import MLP_KINDS, NORM_KINDS
from lt2dsl.validate.context import LOOP_SCHEMA
from lt2dsl.validate.rules import SECTIONS, Rule, all_rules

DOC = Path(__file__).resolve().parent.parent / "docs" / "language.md"
MARKER = "<!-- generated below by `python -m lt2dsl.docs`: do not edit by hand -->"
# Defaults computed from the model or from other options, by the helper that computes them.
DERIVED = {
    "_heads": "model `heads`",
    "_head_dim": "model `head_dim`",
    "_kv_heads": "`heads` in an MHA model, else model `kv_heads`",
    "_max_len": "model `max_len`",
    "_normalize": "`true`; `false` for `feature_map=identity`",
}


def default_text(o: Option) -> str:
    d = o.default
    if callable(d):
        return DERIVED.get(getattr(d, "__name__", ""), "derived (see description)")
    if o.required:
        return "required"
    if d is None:
        return "see description" if "[" in o.doc else "—"
    if isinstance(d, bool):
        return f"`{'true' if d else 'false'}`"
    if isinstance(d, int):
        return f"`{size(d) if o.type == 'size' else d}`"
    return f"`{d}`"


def options_table(options: tuple[Option, ...]) -> list[str]:
    rows = ["| option | type | default | valid values | description |", "|---|---|---|---|---|"]
    for o in options:
        pos = " (positional)" if o.positional else ""
        valid = {"mlp": "a channel mixer (below)", "norm": "a norm (below)"}.get(o.type) or o.range_text()
        doc = o.doc.replace("|", "\\|")
        rows.append(f"| `{o.name}`{pos} | {o.type} | {default_text(o)} | {valid} | {doc} |")
    return rows


def kinds_section() -> list[str]:
    out = ["## Layer kinds", ""]
    for kind, spec in REGISTRY.items():
        out += [f"### `{kind}`", "", spec.summary[0].upper() + spec.summary[1:] + "."]
        if spec.aliases:
            out.append("Aliases: " + ", ".join(f"`{a}`" for a in spec.aliases) + ".")
        if spec.source:
            out.append(f"Source: {spec.source}.")
        out += ["", *options_table(spec.options), ""]
    return out


def channel_section() -> list[str]:
    out = [
        "## Channel mixers (`mlp = ...`) and norms (`norm = ...`)",
        "",
        "`mlp = none` drops a block's MLP half. `norm = sandwich` keeps the norm type and applies "
        "it after the mixer and the MLP too (Ouro).",
        "",
    ]
    for title, kinds in (("mlp", MLP_KINDS), ("norm", NORM_KINDS)):
        for name, opts in kinds.items():
            out += [f"### `{title} = {name}`", ""]
            out += [*options_table(opts), ""] if opts else ["No options.", ""]
    return out


def diagnostics_section() -> list[str]:
    rules = all_rules()
    out = [
        "## Diagnostics",
        "",
        "Codes are stable. The letter is the severity (E error, W warning); the first two digits "
        "the topic: 00 syntax, 01 names, 02 values, 03 structure, 04 kernels, 05 shapes, "
        "09 the driver, 10 checkpoint import, 99 internal errors. `lt2dsl explain CODE` prints one entry.",
        "",
        "| code | severity | topic | problem |",
        "|---|---|---|---|",
    ]
    out += [f"| [{c}](#{c.lower()}) | {r.severity} | {r.topic} | {r.title} |" for c, r in rules.items()]
    out.append("")
    for code, r in rules.items():
        out += [f"### {code}", "", f"**{r.title}** ({r.severity}, {r.topic})", ""]
        for sec in SECTIONS:
            text = r.sections.get(sec, "")
            if sec in ("Example", "Use instead"):
                lang = "lt2" if r.topic not in ("driver", "import", "internal") else "text"
                out += [f"*{sec}:*", "", f"```{lang}", text, "```", ""]
            else:
                out += [f"*{sec}:* {' '.join(text.split())}", ""]
    return out


def generate() -> str:
    """The generated reference (everything below the marker), ending in a newline."""
    lines = [
        "## Model settings",
        "",
        *options_table(MODEL_SETTINGS),
        "",
        "## Loop options",
        "",
        "Written after `T=n`: `loop T=4, final_norm=true, exit=gate(threshold=0.9) < ... >`.",
        "",
        *options_table(LOOP_SCHEMA),
        "",
        "`exit = gate(...)` takes:",
        "",
        *options_table(EXIT_GATE_OPTIONS),
        "",
        *kinds_section(),
        *channel_section(),
        *diagnostics_section(),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_doc(current: str) -> str:
    """`current` (the file's text) with everything below the marker regenerated."""
    intro = current.split(MARKER, 1)[0].rstrip("\n")
    return f"{intro}\n\n{MARKER}\n\n{generate()}"


def explain(code: str) -> str:
    """One code's page, as plain text."""
    r: Rule = all_rules()[code]
    lines = [f"{code} ({r.severity}, {r.topic}): {r.title}", ""]
    for sec in SECTIONS:
        text = r.sections.get(sec, "")
        lines.append(f"{sec}:")
        lines += ["    " + line if line else "" for line in text.splitlines()]
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def main() -> int:
    DOC.write_text(render_doc(DOC.read_text(encoding="utf-8") if DOC.exists() else ""), encoding="utf-8")
    print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
