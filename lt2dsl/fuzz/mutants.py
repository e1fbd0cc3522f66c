"""Character- and token-level damage to valid `.lt2` texts, and random bytes.

A mutation deletes, duplicates or swaps a token, inserts random characters (any code point
below U+0250, control characters and NUL included), truncates the text, replaces one character
with a character of the language's punctuation, or replaces a token with a keyword or a number
that is out of range. Comments are removed from the seeds first: a mutation inside a comment
would change nothing.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

TOKEN = re.compile(r"\w+|[^\w\s]|\s+")
PUNCTUATION = "<>(){};,=*#\"'/.-+0123456789kMTx \n"
REPLACEMENTS = (
    "loop", "let", "par", "repeat", "model", "T", "=", "<", ">", "none", "1e999", "8/0", "32kb",
    "-1", "0", "\n", ";;", "gdn", "dsaa", "(", ")", "33/2", "99999999999", "\ufeff", "\x00",
)  # fmt: skip


def seeds(root: Path) -> list[str]:
    """The example programs and the grammar test inputs, comments removed."""
    files = sorted([*root.glob("examples/*.lt2"), *root.glob("tests/grammar/inputs/*.lt2")])
    return [re.sub(r"#[^\n]*", "", f.read_text(encoding="utf-8")) for f in files]


def mutate(text: str, rnd: random.Random) -> str:
    toks = TOKEN.findall(text)
    # mutate code, not the spaces between it
    i = rnd.choice([k for k, t in enumerate(toks) if not t.isspace()])
    match rnd.randrange(7):
        case 0:
            del toks[i]
        case 1:
            toks.insert(i, toks[i])
        case 2 if i + 1 < len(toks):
            toks[i], toks[i + 1] = toks[i + 1], toks[i]
        case 3:
            toks.insert(i, "".join(chr(rnd.randrange(0, 0x250)) for _ in range(rnd.randint(1, 4))))
        case 4:
            return text[: rnd.randrange(len(text))]
        case 5:
            pos = rnd.randrange(len(text))
            return text[:pos] + rnd.choice(PUNCTUATION) + text[pos + 1 :]
        case _:
            toks[i] = rnd.choice(REPLACEMENTS)
    return "".join(toks)


def inputs(texts: list[str], n: int, rnd: random.Random) -> list[bytes]:
    """n mutants (UTF-8), n/8 random byte strings (mostly not UTF-8) and truncated prefixes."""
    out = [mutate(rnd.choice(texts), rnd).encode() for _ in range(n)]
    out += [bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 80))) for _ in range(n // 8)]
    # proper prefixes only: past a short text's end a "prefix" would be the whole valid text again
    text = rnd.choice(texts)
    out += [text[:k].encode() for k in range(0, min(400, len(text)), 7)]
    return out
