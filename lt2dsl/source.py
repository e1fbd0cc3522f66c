"""Where things come from: `Span` on every IR node, and the source text a diagnostic quotes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Span(BaseModel):
    """A region of a source file, 1-based lines and columns, end column exclusive.

    Spans are metadata, not meaning: two nodes that say the same thing are equal wherever they
    were written, so every Span compares equal to every other. That is what lets
    `parse(print(ir)) == ir` hold although printing moves things around.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str = "<input>"
    line: int = 0
    col: int = 0
    end_line: int = 0
    end_col: int = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Span)

    def __hash__(self) -> int:
        return 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def key(self) -> tuple[str, int, int]:
        """Sort key: diagnostics are reported in source order."""
        return (self.file, self.line, self.col)

    def same(self, other: Span) -> bool:
        """Real positional equality (the `==` above deliberately ignores position)."""
        return (self.file, self.line, self.col, self.end_line, self.end_col) == (
            other.file,
            other.line,
            other.col,
            other.end_line,
            other.end_col,
        )

    @property
    def known(self) -> bool:
        return self.line > 0


NOWHERE = Span()


class SourceFile(BaseModel):
    """The text a file held when it was parsed; diagnostics quote lines from it."""

    model_config = ConfigDict(frozen=True)

    name: str
    text: str

    def line(self, n: int) -> str:
        lines = self.text.splitlines()
        return lines[n - 1] if 1 <= n <= len(lines) else ""


# A `.lt2` file of a real model is a few kilobytes; the deepest model lt2dsl lowers (2,048
# block applications, `lt2dsl/ir/limits.py`) written out one block per 64-byte line is 128 KiB.
# Checking costs ~0.2 ms and ~5 KB per block, so a larger file is refused before it is parsed
# (a 5 MB file would take minutes and gigabytes).
MAX_SOURCE_BYTES = 128 << 10
BOM = "\ufeff"


def decode_source(data: bytes) -> tuple[str | None, str | None]:
    """(text, None) for UTF-8 text (a leading byte-order mark dropped), else (None, why not).

    An invalid UTF-8 sequence or a NUL byte marks a binary file (as git and grep decide);
    `why` gives the position of the first offending byte.
    """
    if len(data) > MAX_SOURCE_BYTES:
        return None, f"larger than {MAX_SOURCE_BYTES // 1024} KiB ({len(data):,} bytes)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 text (byte 0x{data[e.start]:02x} at {_where(data, e.start)})"
    if (nul := data.find(b"\x00")) >= 0:
        return None, f"a binary file (NUL byte at {_where(data, nul)})"
    return text.removeprefix(BOM), None


def _where(data: bytes, offset: int) -> str:
    """`line:col` of a byte offset (columns in bytes: the text cannot be decoded)."""
    line = data.count(b"\n", 0, offset) + 1
    col = offset - data.rfind(b"\n", 0, offset)
    return f"{line}:{col}"
