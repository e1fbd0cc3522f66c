"""The decode bench for people: a rich table and PNG plots (tok/s against context; one model's
speed over another's against context, measured and estimated)."""

from __future__ import annotations

from rich import box
from rich.table import Table

from lt2dsl.engine.bench import passes, write_atomic


def oom_note(row: dict) -> str:
    """An out-of-memory point against the estimate's largest batch for the card."""
    cap = row["estimate_max_batch"]
    agrees = "as the estimate predicts" if row["batch"] > cap else "the estimate expected it to fit"
    skipped = ", skipped after a smaller context ran out" if row.get("skipped") else ""
    return f"out of memory{skipped}: estimate's largest batch {cap} ({agrees})"


def table(rows: list[dict], info: dict) -> Table:
    t = Table(
        title=f"decode on {info['device']} ({info['dtype']}), estimate for {info['hw']}",
        box=box.SIMPLE_HEAVY,
    )
    t.add_column("model")
    for name in ("B", "context", "tok/s", "estimate tok/s", "measured / estimate", "kernels", "step ms",
                 "GB/s", "prefill s", "first call s", "cache GB"):  # fmt: skip
        t.add_column(name, justify="right")
    for r in rows:
        head = [r["model"], str(r["batch"]), str(r["ctx"])]
        kernels = f"{r['estimate_kernels']:,}" if "estimate_kernels" in r else ""
        if r.get("oom"):
            t.add_row(*head, "OOM", f"{r['estimate_tok_s']:.0f}", oom_note(r), kernels, "", "", "", "", "")
            continue
        t.add_row(
            *head,
            f"{r['tok_s']:.1f}",
            f"{r['estimate_tok_s']:.0f}",
            f"{r['tok_s'] / r['estimate_tok_s']:.2f}",
            kernels,
            f"{r['step_ms']:.2f}",
            f"{r['bandwidth_gb_s']:.1f}",
            f"{r['prefill_s']:.3f}",
            f"{r['first_s']:.3f}",
            f"{r['cache_bytes'] / 1e9:.3f}",
        )
    return t


def summary_table(summarized: list[dict]) -> Table:
    """`bench.summary` for people: per model and batch, measured / estimate over its contexts, the
    speed its longest context keeps of its shortest's beside the estimate's, and its OOMs."""
    t = Table(title="per model and batch", box=box.SIMPLE_HEAVY)
    t.add_column("model")
    for name in ("B", "contexts", "measured / estimate", "longest / shortest", "estimated", "out of memory"):
        t.add_column(name, justify="right")

    def span(v: list) -> str:
        return "" if not v else f"{v[0]:.2f}" if f"{v[0]:.2f}" == f"{v[1]:.2f}" else f"{v[0]:.2f}–{v[1]:.2f}"

    for s in summarized:
        ctx = f"{s['contexts'][0]}–{s['contexts'][1]}" if s["contexts"] else "none ran"
        kept = "" if s["kept"] is None else f"{s['kept']:.2f}"
        est = "" if s["estimate_kept"] is None else f"{s['estimate_kept']:.2f}"
        oom = ", ".join(map(str, s["oom"]))
        if s["oom"] or not s["as_estimated"]:
            oom += " (as estimated)" if s["as_estimated"] else " (not where the estimate's max batch says)"
        t.add_row(s["model"], str(s["batch"]), ctx, span(s["of_estimate"]), kept, est, oom.strip())
    return t


def plot(path, rows: list[dict], info: dict) -> None:
    """tok/s against context (log scales): one colour per model and one marker per batch, measured
    solid, the estimate dashed, out-of-memory points as crosses on the estimate line; the legend
    beside the axes, so no line hides under it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        series.setdefault((r["model"], r["batch"]), []).append(r)
    models = list(dict.fromkeys(m for m, _ in series))
    batches = sorted({b for _, b in series})
    cmap = plt.get_cmap("tab10" if len(models) <= 10 else "tab20")
    for (name, batch), pts in series.items():
        color, marker = cmap(models.index(name) % cmap.N), "osD^vp"[batches.index(batch) % 6]
        ctx = [p["ctx"] for p in pts]
        ax.plot(ctx, [p["estimate_tok_s"] for p in pts], "--", color=color, alpha=0.6)
        ok = [p for p in pts if not p.get("oom")]
        ax.plot([p["ctx"] for p in ok], [p["tok_s"] for p in ok], "-", marker=marker, color=color,
                label=f"{name} B={batch}")  # fmt: skip
        oom = [p for p in pts if p.get("oom")]
        ax.plot([p["ctx"] for p in oom], [p["estimate_tok_s"] for p in oom], "x", color=color, markersize=9)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(
        f"{info['device']} ({info['dtype']})\nmeasured (solid) vs estimate for {info['hw']} (dashed); "
        "× out of memory",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, bbox_to_anchor=(1.02, 1), loc="upper left", borderaxespad=0)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


# The research's GDN+DSA over standard looped transformer decode speed at 8k (125 vs 22 tok/s)
PAPER_RATIO = 5.7


def measured_ratios(rows: list[dict], fast: str, slow: str) -> list[dict]:
    """`fast`'s measured tok/s over `slow`'s at every (batch, context) both ran; a point where only
    `slow` ran out of memory is kept with `measured` None and `slow_oom` True."""
    by = {(r["model"], r["batch"], r["ctx"]): r for r in rows}
    out = []
    for (name, batch, ctx), r in by.items():
        o = by.get((slow, batch, ctx))
        if name != fast or o is None or r.get("oom"):
            continue
        measured = None if o.get("oom") else r["tok_s"] / o["tok_s"]
        out.append({"batch": batch, "ctx": ctx, "measured": measured, "slow_oom": bool(o.get("oom"))})
    return out


def ratio_plot(path, curve: list[dict], measured: list[dict], info: dict, names: tuple[str, str],
               target: float = PAPER_RATIO) -> None:  # fmt: skip
    """names[0]'s decode speed over names[1]'s against context (log scales), one colour per batch:
    the estimate dashed (`bench.ratio_curve`), measured dots (`measured_ratios`), a triangle at
    the top where only the slow model runs out of memory (estimated: open; measured: filled),
    the research's `target` as a grey line, and each batch's first context that passes it
    (`bench.passes`) marked by a vertical dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    values = [r["estimate"] for r in curve if r["estimate"]] + [
        m["measured"] for m in measured if m["measured"]
    ]
    top = max([target, *values]) * 1.6
    for i, batch in enumerate(sorted({r["batch"] for r in curve})):
        color = f"C{i % 10}"
        pts = [r for r in curve if r["batch"] == batch]
        est = [r for r in pts if r["estimate"] is not None]
        ax.plot([r["ctx"] for r in est], [r["estimate"] for r in est], "--", color=color, alpha=0.7)
        oom = [r["ctx"] for r in pts if r["fast_fits"] and not r["slow_fits"]]
        ax.plot(oom, [top / 1.25] * len(oom), "^", mfc="none", color=color, markersize=8)
        mine = [m for m in measured if m["batch"] == batch]
        ok = [m for m in mine if m["measured"] is not None]
        ax.plot([m["ctx"] for m in ok], [m["measured"] for m in ok], "o-", color=color, label=f"B={batch}")
        gone = [m["ctx"] for m in mine if m["slow_oom"]]
        ax.plot(gone, [top / 1.25] * len(gone), "^", color=color, markersize=8)
    for batch, p in passes(curve, target).items():
        ax.axvline(p["ctx"], color="grey", linestyle=":", alpha=0.6)
        ax.annotate(f"B={batch}: {p['why']}", (p["ctx"], top / 1.6), rotation=90, fontsize=7,
                    ha="right", va="top", color="grey", annotation_clip=False)  # fmt: skip
    ax.axhline(target, color="grey", alpha=0.8)
    # x in axes fraction, y in data: the label stays at the left edge whatever the contexts
    ax.text(0.01, target * 1.04, f"research: {target}x at 8k", transform=ax.get_yaxis_transform(),
            fontsize=8, color="grey")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(top=top)
    ticks = matplotlib.ticker
    ax.yaxis.set_major_formatter(ticks.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(ticks.FuncFormatter(lambda v, _: f"{v:g}x" if str(v)[0] in "2358" else ""))
    ax.xaxis.set_major_formatter(ticks.FuncFormatter(lambda v, _: f"{v / 1024:g}k"))
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(f"{names[0]} / {names[1]} decode speed")
    ax.set_title(
        f"{info['device']} ({info['dtype']}): measured (solid), estimate for {info['hw']} (dashed);"
        "\n▲ the baseline out of memory (open: estimated, filled: measured)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
