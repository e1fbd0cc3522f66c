"""Render reports: a rich table for people, JSON / CSV for machines, Markdown for docs.

`Comparison` bundles what one invocation prints: one report per `--seq` value, each optionally
beside the `--vs` model's report at the same inputs.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from lt2dsl.cost import fmt
from lt2dsl.cost.report import BlockRow, Report


@dataclass(frozen=True)
class Entry:
    report: Report
    vs: Report | None = None
    vs_name: str | None = None


# ---- summary figures shared by every format ---------------------------------------------------

FIGURES: list[tuple[str, str, str]] = [  # (json path, label, kind of number)
    ("params.stored", "parameters stored", "count"),
    ("params.executed", "parameters executed", "count"),
    ("flops_per_token.prefill", "prefill FLOPs/token", "si"),
    ("flops_per_token.decode", "decode FLOPs/token @L", "si"),
    ("flops_per_token.train", "train FLOPs/token", "si"),
    ("memory.weights_bytes", "weights", "bytes"),
    ("memory.state_bytes", "state (batch)", "bytes"),
    ("memory.kv_bytes", "KV @L (batch)", "bytes"),
    ("memory.cache_bytes", "cache @L (batch)", "bytes"),
    ("memory.train_activations_bytes", "train activations", "bytes"),
    ("roofline.prefill_tokens_per_s", "prefill tokens/s", "si"),
    ("roofline.decode_tokens_per_s", "decode tokens/s @L", "si"),
    ("roofline.ttft_s", "time to first token", "s"),
    ("capacity.max_batch", "max batch @L", "int"),
    ("capacity.max_len", "max L @batch", "len"),
]
# Which figures `--mode` keeps in the people-facing tables (machines always get all of them).
MODE_FIGURES = {
    "train": {
        "params.stored",
        "params.executed",
        "flops_per_token.train",
        "memory.weights_bytes",
        "memory.train_activations_bytes",
    },
    "prefill": {
        "params.stored",
        "params.executed",
        "flops_per_token.prefill",
        "memory.weights_bytes",
        "memory.cache_bytes",
        "roofline.prefill_tokens_per_s",
        "roofline.ttft_s",
    },
    "decode": {
        "params.stored",
        "params.executed",
        "flops_per_token.decode",
        "memory.weights_bytes",
        "memory.state_bytes",
        "memory.kv_bytes",
        "memory.cache_bytes",
        "roofline.decode_tokens_per_s",
        "capacity.max_batch",
        "capacity.max_len",
    },
}


def figures(mode: str) -> list[tuple[str, str, str]]:
    keep = MODE_FIGURES.get(mode)
    return [f for f in FIGURES if keep is None or f[0] in keep]


def get(report: Report, path: str):
    v = report
    for part in path.split("."):
        v = getattr(v, part)
    return v


def show(value, kind: str) -> str:
    if value is None:
        return fmt.length(None) if kind == "len" else "-"
    return {
        "count": fmt.count,
        "si": fmt.si,
        "bytes": fmt.nbytes,
        "s": fmt.seconds,
        "len": fmt.length,
        "int": lambda v: f"{v:,}",
    }[kind](value)


# ---- rich ---------------------------------------------------------------------------------------


def title(r: Report) -> str:
    i = r.inputs
    return (
        f"{i.model} · L={fmt.length(i.seq)} · batch {i.batch} · {i.dtype} "
        f"(state {i.state_dtype}, kv {i.kv_dtype}) · {i.hw}"
    )


def blocks_table(r: Report) -> Table:
    t = Table(
        title=title(r),
        caption=PER_APPLICATION,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        caption_justify="left",
        pad_edge=False,
    )
    for name, just in [
        ("block", "left"),
        ("kind", "left"),
        ("options", "left"),
        ("×T", "right"),
        ("params", "right"),
        ("executed", "right"),
        ("prefill FLOP/tok", "right"),
        ("decode FLOP/tok", "right"),
        ("state/seq", "right"),
        ("KV/seq @L", "right"),
        ("decode B/tok", "right"),
        ("FLOP/B", "right"),
        ("bound", "left"),
    ]:
        t.add_column(name, justify=just, no_wrap=name != "options")
    for row in r.blocks + r.extras:
        t.add_row(*_cells(row))
    return t


def _cells(row: BlockRow) -> list[str]:
    return [
        row.id + (f" ({row.label})" if row.label else ""),
        row.kind,
        row.options,
        str(row.iterations),
        fmt.count(row.params_stored),
        fmt.count(row.params_executed),
        fmt.si(row.flops_prefill),
        fmt.si(row.flops_decode),
        fmt.nbytes(row.state_bytes) if row.state_bytes else "-",
        fmt.nbytes(row.kv_bytes) if row.kv_bytes else "-",
        fmt.nbytes(row.decode_bytes),
        f"{row.intensity:.1f}",
        row.bound,
    ]


def totals_table(e: Entry, mode: str = "all") -> Table:
    r = e.report
    t = Table(title="totals", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    t.add_column("figure")
    t.add_column(r.inputs.model, justify="right")
    if e.vs:
        t.add_column(e.vs_name or e.vs.inputs.model, justify="right")
        t.add_column("ratio", justify="right")
    for path, label, kind in figures(mode):
        a = get(r, path)
        cells = [label, show(a, kind)]
        if e.vs:
            b = get(e.vs, path)
            cells += [show(b, kind), fmt.ratio(a, b)]
        t.add_row(*cells)
    return t


# The block table's columns after `executed` are per application: one pass of the block, which
# a loop of T iterations makes T times; the totals multiply them by ×T.
PER_APPLICATION = (
    "per application (one iteration of a looped block): FLOP/tok, state/seq, KV/seq and decode "
    "B/tok; totals multiply them by ×T"
)


def notes(r: Report, mode: str = "all", sweep: bool = False) -> Text:
    """The figures under the tables, those of `mode` only; in a sweep, the L-dependent ones are
    labelled as the first length's."""
    p, th, ro, m = r.params, r.theory, r.roofline, r.memory
    shows = {part: mode in ("all", part) for part in ("train", "prefill", "decode")}
    first = [
        f"embedding share {p.embedding_share:.1%} · effective depth {th.effective_depth} · "
        f"receptive field {fmt.length(th.receptive_field)} tokens"
        + (f" · looped delta-rule update rank ≤ {th.update_rank} per token" if th.update_rank else "")
    ]
    at_L = [
        f"prefill {ro.prefill_bound}-bound" if shows["prefill"] else "",
        f"decode {ro.decode_bound}-bound ({fmt.nbytes(ro.decode_bytes_per_step)} moved per step, "
        f"{ro.decode_kernels:,} kernels"
        + (f" costing {fmt.seconds(ro.decode_launch_s)}" if ro.decode_launch_s else "")
        + f", {fmt.seconds(ro.decode_step_s)})"
        if shows["decode"]
        else "",
        f"train activations {fmt.nbytes(m.train_activations_bytes)} "
        f"({fmt.nbytes(m.train_activations_recompute_bytes)} with recomputation)"
        if shows["train"]
        else "",
    ]
    bounds = ", ".join(x for x in at_L[:2] if x)
    lines = [" · ".join(x for x in (bounds, at_L[2]) if x)] if any(at_L) else []
    if ro.generate_s is not None and shows["decode"]:
        lines.append(
            f"generating {r.inputs.gen} tokens after a prompt of {fmt.length(r.inputs.seq)}: "
            f"{fmt.seconds(ro.generate_s)} ({fmt.si(r.inputs.gen * r.inputs.batch / ro.generate_s)} "
            f"tokens/s with the prefill)"
        )
    if r.flops_per_token.decode_expected is not None and shows["decode"]:
        lines.append(
            f"expected decode FLOPs/token with the exit profile: {fmt.si(r.flops_per_token.decode_expected)}"
        )
    if r.capacity.max_len_note and shows["decode"]:
        lines.append(f"max L: {r.capacity.max_len_note}")
    if sweep and lines:
        lines = [f"at L={fmt.length(r.inputs.seq)}, the sweep's first length:", *(f"  {x}" for x in lines)]
    lines = first + lines + ["conventions:"] + [f"  - {c}" for c in r.conventions]
    return Text("\n".join(lines))


def sweep_table(entries: list[Entry]) -> Table:
    first = entries[0]
    t = Table(
        title=f"sweep over L · {first.report.inputs.model}" + (f" vs {first.vs_name}" if first.vs else ""),
        box=box.SIMPLE_HEAD,
        title_justify="left",
        pad_edge=False,
    )
    cols = [
        ("L", None),
        ("decode FLOP/tok", "flops_per_token.decode"),
        ("cache", "memory.cache_bytes"),
        ("decode tok/s", "roofline.decode_tokens_per_s"),
        ("prefill tok/s", "roofline.prefill_tokens_per_s"),
        ("max batch", "capacity.max_batch"),
    ]
    for name, _ in cols:
        t.add_column(name, justify="right")
    if first.vs:
        for name in ("cache ratio", "decode tok/s ratio"):
            t.add_column(name, justify="right")
    kinds = {p: k for p, _, k in FIGURES}
    for e in entries:
        r = e.report
        cells = [fmt.length(r.inputs.seq)] + [show(get(r, p), kinds[p]) for _, p in cols[1:]]
        if e.vs:
            cells += [
                fmt.ratio(r.memory.cache_bytes, e.vs.memory.cache_bytes),
                fmt.ratio(r.roofline.decode_tokens_per_s, e.vs.roofline.decode_tokens_per_s),
            ]
        t.add_row(*cells)
    return t


def rich_output(entries: list[Entry], mode: str = "all"):
    if len(entries) > 1:
        return Group(sweep_table(entries), Text(""), notes(entries[0].report, mode, sweep=True))
    e = entries[0]
    return Group(blocks_table(e.report), totals_table(e, mode), notes(e.report, mode))


def to_text(entries: list[Entry], width: int = 160, mode: str = "all") -> str:
    """The rich output as plain text (goldens, non-terminal stdout)."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False).print(rich_output(entries, mode))
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


# ---- machines -----------------------------------------------------------------------------------


def _entry_dict(e: Entry) -> dict:
    d = e.report.model_dump(mode="json")
    if e.vs:
        d["vs"] = e.vs.model_dump(mode="json")
        d["vs"]["name"] = e.vs_name
        d["ratios"] = {p: _ratio_num(get(e.report, p), get(e.vs, p)) for p, _, _ in FIGURES}
    return d


def _ratio_num(a, b):
    return None if (a is None or b in (None, 0)) else a / b


def to_json(entries: list[Entry]) -> str:
    if len(entries) == 1:
        return json.dumps(_entry_dict(entries[0]), indent=2)
    return json.dumps({"sweep": [_entry_dict(e) for e in entries]}, indent=2)


CSV_COLS = [
    "model",
    "seq",
    "batch",
    "id",
    "kind",
    "options",
    "iterations",
    "params_stored",
    "params_executed",
    "flops_prefill",
    "flops_decode",
    "state_bytes",
    "kv_bytes",
    "decode_bytes",
    "intensity",
    "bound",
]


def to_csv(entries: list[Entry]) -> str:
    """One row per (model, L, block) and a `TOTAL` row per (model, L) holding the totals."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLS)
    for e in entries:
        for r in filter(None, (e.report, e.vs)):
            for row in r.blocks + r.extras:
                d = row.model_dump()
                w.writerow([r.inputs.model, r.inputs.seq, r.inputs.batch] + [d[c] for c in CSV_COLS[3:]])
            w.writerow(
                [
                    r.inputs.model,
                    r.inputs.seq,
                    r.inputs.batch,
                    "TOTAL",
                    "",
                    "",
                    "",
                    r.params.stored,
                    r.params.executed,
                    r.flops_per_token.prefill,
                    r.flops_per_token.decode,
                    r.memory.state_bytes,
                    r.memory.kv_bytes,
                    r.roofline.decode_bytes_per_step,
                    "",
                    r.roofline.decode_bound,
                ]
            )
    return buf.getvalue()


def to_markdown(entries: list[Entry]) -> str:
    out = []
    for e in entries:
        r = e.report
        out.append(f"### {title(r)}\n")
        hdr = [
            "block",
            "kind",
            "options",
            "×T",
            "params",
            "executed",
            "prefill FLOP/tok",
            "decode FLOP/tok",
            "state/seq",
            "KV/seq @L",
            "decode B/tok",
            "FLOP/B",
            "bound",
        ]
        out.append("| " + " | ".join(hdr) + " |")
        out.append("|" + "---|" * len(hdr))
        for row in r.blocks + r.extras:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(row)) + " |")
        out.append("")
        out.append(PER_APPLICATION[0].upper() + PER_APPLICATION[1:] + ".")
        out.append("")
        hdr = ["figure", r.inputs.model] + ([e.vs_name or e.vs.inputs.model, "ratio"] if e.vs else [])
        out.append("| " + " | ".join(hdr) + " |")
        out.append("|" + "---|" * len(hdr))
        for path, label, kind in FIGURES:
            a = get(r, path)
            cells = [label, show(a, kind)]
            if e.vs:
                b = get(e.vs, path)
                cells += [show(b, kind), fmt.ratio(a, b)]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out.append("Conventions: " + "; ".join(entries[0].report.conventions) + ".")
    return "\n".join(out) + "\n"
