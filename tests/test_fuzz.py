"""Random and mutated `.lt2` text through the CLI, in-process: a diagnostic, never a crash.

Mutations of valid files (a token deleted, duplicated or swapped with its neighbour, random
bytes inserted, the text truncated, a character replaced) and random byte strings go through
`lt2dsl check`. Every run must end with exit code 1 and at least one `error[...]` diagnostic,
or — when the mutation happens to leave a valid program — exit code 0 and no error; never an
internal error (exit 3), never a traceback. The seed is fixed, so a failure reproduces.
"""

import contextlib
import io
import random
import re
from pathlib import Path

import pytest

from lt2dsl.cli import main
from lt2dsl.frontend import load

ROOT = Path(__file__).resolve().parents[1]
SEEDS = sorted([*ROOT.glob("examples/*.lt2"), *ROOT.glob("tests/grammar/inputs/*.lt2")])
TOKEN = re.compile(r"\w+|[^\w\s]|\s+")
N = 300


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
            toks.insert(i, "".join(chr(rnd.randrange(1, 0x250)) for _ in range(rnd.randint(1, 4))))
        case 4:
            return text[: rnd.randrange(len(text))]
        case 5:
            pos = rnd.randrange(len(text))
            return text[:pos] + rnd.choice("<>(){};,=*#\"'/.-+0123456789kMTx \n") + text[pos + 1 :]
        case _:
            toks[i] = rnd.choice(
                [
                    "loop",
                    "let",
                    "par",
                    "repeat",
                    "model",
                    "T",
                    "=",
                    "<",
                    ">",
                    "none",
                    "1e999",
                    "8/0",
                    "32kb",
                    "-1",
                    "0",
                    "\n",
                    ";;",
                    "gdn",
                    "dsaa",
                    "(",
                    ")",
                ]
            )
    return "".join(toks)


def inputs() -> list[bytes]:
    rnd = random.Random(20260101)
    # without comments: a mutation inside a comment would change nothing
    texts = [re.sub(r"#[^\n]*", "", s.read_text()) for s in SEEDS]
    out = [mutate(rnd.choice(texts), rnd).encode() for _ in range(N)]
    out += [bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 80))) for _ in range(N // 8)]
    # proper prefixes only: past a short text's end a "prefix" would be the whole valid text again
    text = rnd.choice(texts)
    out += [text[:k].encode() for k in range(0, min(400, len(text)), 7)]
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[tuple[bytes, int, str]]:
    f = tmp_path_factory.mktemp("fuzz") / "case.lt2"
    out = []
    for data in inputs():
        f.write_bytes(data)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = main(["check", str(f)])
        out.append((data, status, err.getvalue()))
    return out


def test_never_an_internal_error(results):
    for data, status, err in results:
        assert status in (0, 1), (data, status, err)
        assert "E9999" not in err and "Traceback" not in err, (data, err)


def test_errors_come_with_diagnostics(results):
    for data, status, err in results:
        if status == 1:
            assert re.search(r"^error\[E\d{4}\]: ", err, re.M), (data, err)
        else:
            assert "error[" not in err, (data, err)


def test_the_api_agrees_with_the_cli(results):
    for data, status, _ in results[::10]:
        text = data.decode("utf-8", errors="replace")
        if status == 1 and data == text.encode():
            assert not load(text + "\n" if "\n" not in text else text).ok, data


def test_most_mutations_are_errors(results):
    errors = sum(status == 1 for _, status, _ in results)
    assert errors > 0.85 * len(results), f"only {errors} of {len(results)} inputs were errors"
