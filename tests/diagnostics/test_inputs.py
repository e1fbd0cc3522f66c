"""Every way a source reaches lt2dsl, and every way a diagnostic reaches the terminal.

Files: a UTF-8 byte-order mark is accepted, non-UTF-8 or binary bytes are refused with E0901 by
every command (never an internal error), a source over the size limit with E0903 before it is
parsed. Rendering: control characters in the source are shown as control pictures, long lines
are cut around the span with the caret still under it, repeated diagnostics are summarised.
"""

import io
import re
import sys
import time

import pytest

from lt2dsl import diagnostics as dg
from lt2dsl.frontend import load
from lt2dsl.source import MAX_SOURCE_BYTES, SourceFile, Span
from tests.test_cli import run

COMMANDS = [["check"], ["fmt"], ["fmt", "--check"], ["graph"], ["compile"], ["compile", "--estimate"]]
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"dim = 64\ngdn\xff\n", r"not UTF-8 text \(byte 0xff at 2:4\)"),
        (b"\xff\xfe\x00d\x00i\x00m", r"not UTF-8 text"),  # UTF-16
        (b"dim = 64\ng\x00dn\n", r"a binary file \(NUL byte at 2:2\)"),
    ],
    ids=["latin1", "utf16", "nul"],
)
def test_undecodable_files_are_refused_by_every_command(tmp_path, capsys, argv, data, why):
    f = tmp_path / "m.lt2"
    f.write_bytes(data)
    status, _, err = run(capsys, *argv[:1], str(f), *argv[1:])
    assert status == 1, err
    assert re.search(r"error\[E0901\]: cannot read `.*m.lt2`: " + why, err), err
    assert "E9999" not in err and "Traceback" not in err and not RAW_CONTROL.search(err)
    assert f.read_bytes() == data  # fmt left it alone


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_byte_order_mark_is_accepted_by_every_command(tmp_path, capsys, argv):
    f = tmp_path / "m.lt2"
    f.write_bytes("\ufeffdim = 64\n\ngdn\n".encode())
    status, _, err = run(capsys, *argv[:1], str(f), *argv[1:])
    assert status == 0, err
    assert load(f).ok and load("\ufeffdim = 64\ngdn\n").ok


def test_fmt_from_stdin_refuses_non_utf8(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"dim = 64\n\xffgdn\n")))
    status, out, err = run(capsys, "fmt", "-")
    assert (status, out) == (1, "") and "E0901" in err and "`<stdin>`" in err


def test_sources_over_the_size_limit(tmp_path, capsys):
    """Refused before parsing: a 2 MB file answers at once (parsing it would take minutes)."""
    big = tmp_path / "big.lt2"
    big.write_text("dim = 64\n" + "gdn\n" * (2 * MAX_SOURCE_BYTES // 4))
    t0 = time.perf_counter()
    for argv in (["check", str(big)], ["fmt", "--check", str(big)]):
        status, _, err = run(capsys, *argv)
        assert status == 1 and "error[E0903]" in err and f"{MAX_SOURCE_BYTES:,} bytes" in err, err
    assert time.perf_counter() - t0 < 5
    assert [d.code for d in load("gdn\n" * MAX_SOURCE_BYTES).diagnostics] == ["E0903"]
    # at the limit the source is read (and checked)
    assert [d.code for d in load("dim = 64\ngdn\n" + " " * (MAX_SOURCE_BYTES - 14)).diagnostics] == []


def test_control_characters_are_shown_as_pictures():
    d = load("dim = 64\ngdn\x1b[2J; \x07dsa\n").diagnostics[0]
    text = dg.render_all([d], load("dim = 64\ngdn\x1b[2J; \x07dsa\n").sources)
    assert "\x1b" not in text and "␛" in text
    assert dg.visible("a\tb\x00c\u202ed") == "a b␀c\ufffdd"


def test_long_lines_are_cut_around_the_span():
    line = "gdn; " * 60 + "dsaa; " + "gdn; " * 60
    col = line.index("dsaa") + 1
    src = SourceFile(name="f", text=line)
    span = Span(file="f", line=1, col=col, end_line=1, end_col=col + 4)
    text = dg.render(dg.error("E0101", "unknown layer `dsaa`", span, label="here"), {"f": src})
    quoted, carets = text.splitlines()[3], text.splitlines()[4]
    assert len(quoted) <= dg.MAX_LINE + 10 and quoted.startswith("1 | …") and quoted.endswith("…")
    at = carets.index("^")
    assert quoted[at : at + 4] == "dsaa" and carets[at:].startswith("^^^^ here")


def test_short_lines_are_not_cut():
    assert dg.window("gdn; dsaa", 6, 4) == ("gdn; dsaa", 6, 4)


def test_repeated_diagnostics_are_summarised():
    span = Span(file="f", line=1, col=1, end_line=1, end_col=2)
    ws = [dg.warning("W0302", "loop nested inside another loop", span) for _ in range(10)]
    es = [dg.error("E0101", f"unknown layer `x{i}`", span) for i in range(25)]
    text = dg.render_all(ws + es, {})
    assert text.count("warning[W0302]: loop nested") == dg.MAX_SAME[dg.Severity.WARNING]
    assert "warning[W0302]: 7 more like the above, not shown" in text
    assert text.count("error[E0101]: unknown layer") == 20 and "error[E0101]: 5 more like the above" in text
    assert text.endswith("error: aborting due to 25 previous errors; 10 warnings emitted")
