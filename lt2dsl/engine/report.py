"""The decode bench for people: a rich table and a PNG plot (tok/s against context)."""

from __future__ import annotations

from rich import box
from rich.table import Table

from lt2dsl.engine.bench import write_atomic


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
    for name in ("B", "context", "tok/s", "estimate tok/s", "measured / estimate", "step ms", "GB/s",
                 "prefill s", "first call s", "cache GB"):  # fmt: skip
        t.add_column(name, justify="right")
    for r in rows:
        head = [r["model"], str(r["batch"]), str(r["ctx"])]
        if r.get("oom"):
            t.add_row(*head, "OOM", f"{r['estimate_tok_s']:.0f}", oom_note(r), "", "", "", "", "")
            continue
        t.add_row(
            *head,
            f"{r['tok_s']:.1f}",
            f"{r['estimate_tok_s']:.0f}",
            f"{r['tok_s'] / r['estimate_tok_s']:.2f}",
            f"{r['step_ms']:.2f}",
            f"{r['bandwidth_gb_s']:.1f}",
            f"{r['prefill_s']:.3f}",
            f"{r['first_s']:.3f}",
            f"{r['cache_bytes'] / 1e9:.3f}",
        )
    return t


def plot(path, rows: list[dict], info: dict) -> None:
    """tok/s against context (log scales): one colour per (model, batch), measured solid with dots,
    the estimate dashed, out-of-memory points as crosses on the estimate line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        series.setdefault((r["model"], r["batch"]), []).append(r)
    for i, ((name, batch), pts) in enumerate(series.items()):
        color = f"C{i % 10}"
        ctx = [p["ctx"] for p in pts]
        ax.plot(ctx, [p["estimate_tok_s"] for p in pts], "--", color=color, alpha=0.7)
        ok = [p for p in pts if not p.get("oom")]
        ax.plot(
            [p["ctx"] for p in ok], [p["tok_s"] for p in ok], "o-", color=color, label=f"{name} B={batch}"
        )
        oom = [p for p in pts if p.get("oom")]
        ax.plot([p["ctx"] for p in oom], [p["estimate_tok_s"] for p in oom], "x", color=color, markersize=9)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(
        f"{info['device']} ({info['dtype']}): measured (solid) vs estimate for {info['hw']} (dashed)"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
