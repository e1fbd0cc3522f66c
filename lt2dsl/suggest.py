""" "Did you mean": nearby names by restricted Damerau–Levenshtein distance (Elm's `nearbyNames`).

A candidate is close when its distance is at most 1 for names of 3 characters or fewer and at most
2 otherwise; a case-only difference counts as distance 0. At most 4 are shown, nearest first.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_SHOWN = 4


def distance(a: str, b: str) -> int:
    """Restricted Damerau–Levenshtein (optimal string alignment): insertions, deletions,
    substitutions and swaps of two adjacent characters each cost 1."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[len(b)]


def threshold(name: str) -> int:
    return 1 if len(name) <= 3 else 2


def nearby(name: str, candidates: Iterable[str]) -> list[str]:
    """The close candidates, nearest first (ties keep the candidates' order), at most 4."""
    scored = []
    for i, c in enumerate(dict.fromkeys(candidates)):
        d = 0 if c.lower() == name.lower() else distance(name, c)
        if d <= threshold(name) and c != name:
            scored.append((d, i, c))
    return [c for _, _, c in sorted(scored)[:MAX_SHOWN]]


def quoted(names: Iterable[str]) -> str:
    """`a`, `b` and `c`."""
    q = [f"`{n}`" for n in names]
    return q[0] if len(q) == 1 else ", ".join(q[:-1]) + " and " + q[-1] if q else ""


def did_you_mean(name: str, candidates: Iterable[str], what: str, plural: str | None = None) -> str:
    """A help line: the close candidates, or every valid one when none is close.

    `what` names the thing ("layer", "option of `gdn`"); `plural` its plural ("layers").
    """
    candidates = list(candidates)
    close = nearby(name, candidates)
    plural = plural or what + "s"
    if len(close) == 1:
        article = "an" if what[0] in "aeiou" else "a"
        return f"{article} {what} with a similar name exists: `{close[0]}`"
    if close:
        return f"{plural} with similar names exist: {quoted(close)}"
    if not candidates:
        return f"there are no {plural}"
    return f"the valid {plural} are {quoted(candidates)}"
