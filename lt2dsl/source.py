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
