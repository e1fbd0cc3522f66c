"""Number formatting for reports: short, unit-bearing, stable for golden files."""

from __future__ import annotations


def si(x: float, unit: str = "", digits: int = 3) -> str:
    """1234567 → '1.23M' (decimal prefixes: parameters, FLOPs, tokens/s)."""
    if x == 0:
        return f"0{unit}"
    for p, s in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= p:
            return f"{_sig(x / p, digits)}{s}{unit}"
    return f"{_sig(x, digits)}{unit}"


def count(x: float) -> str:
    """Parameter counts: B for billions as the field writes them."""
    return si(x).replace("G", "B")


def nbytes(x: float) -> str:
    """Binary prefixes for memory: 1536 → '1.50 KiB'."""
    if x < 1024:
        return f"{int(x)} B"
    for p, s in ((1024**5, "PiB"), (1024**4, "TiB"), (1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if x >= p:
            return f"{x / p:.2f} {s}"
    return f"{x} B"


def seconds(x: float) -> str:
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} µs"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    if b == 0:
        return "-" if a == 0 else "∞"
    r = a / b
    return f"{r:.2f}×" if r >= 0.1 else f"{r:.2g}×"


def length(x: int | None) -> str:
    if x is None:
        return "unbounded"
    if x >= 1024 * 1024 and x % (1024 * 1024) == 0:
        return f"{x // (1024 * 1024)}M"
    if x >= 1024 and x % 1024 == 0:
        return f"{x // 1024}k"
    return si(x)


def _sig(v: float, digits: int) -> str:
    s = f"{v:.{digits}g}"
    return s
