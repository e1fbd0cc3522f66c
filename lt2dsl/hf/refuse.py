"""Why a checkpoint cannot be imported: one exception naming the config field, shown as a diagnostic."""

from __future__ import annotations

import json

from lt2dsl.diagnostics import Diagnostic, error
from lt2dsl.source import Span

# E1001: the checkpoint has a feature `.lt2` cannot express; E1002: the folder or its weights are
# not what its config says.
UNSUPPORTED, MALFORMED = "E1001", "E1002"


class Refused(ValueError):
    """A checkpoint lt2dsl will not import. `field` is the config.json key at fault ("" when the
    problem is the folder or its weights), `file` where to point."""

    def __init__(self, field: str, message: str, help: str | None = None, file: str = ""):
        super().__init__(message if not field else f"{message} (config field `{field}`)")
        self.field, self.message, self.help, self.file = field, message, help, file

    def diagnostic(self, config_path: str, config_text: str) -> Diagnostic:
        """The refusal as an error pointing at the field in config.json (at the file otherwise)."""
        code = UNSUPPORTED if self.field else MALFORMED
        span = field_span(config_path, config_text, self.field) if self.field else Span(file=self.file)
        label = f"`{self.field}` is not supported" if self.field else ""
        return error(code, self.message, span, label=label, help=self.help)


def field_span(path: str, text: str, field: str) -> Span:
    """Where `"<last part of field>":` is written in config.json (the whole file when not found)."""
    key = json.dumps(field.split(".")[-1]) + ":"
    for i, line in enumerate(text.splitlines(), start=1):
        col = line.find(key)
        if col >= 0:
            return Span(file=path, line=i, col=col + 1, end_line=i, end_col=col + len(key))
    return Span(file=path)


def refuse_unless(ok: bool, field: str, message: str, help: str | None = None) -> None:
    if not ok:
        raise Refused(field, message, help)
