"""Why a checkpoint cannot be imported: one exception naming the config field, shown as a diagnostic."""

from __future__ import annotations

import json

from lt2dsl.diagnostics import Diagnostic
from lt2dsl.source import Span
from lt2dsl.validate.checkpoints import check_expressible, check_weights_match


class Refused(ValueError):
    """A checkpoint lt2dsl will not import. `field` is the config.json key at fault ("" when the
    problem is the folder or its weights), `file` where to point."""

    def __init__(self, field: str, message: str, help: str | None = None, file: str = ""):
        super().__init__(message if not field else f"{message} (config field `{field}`)")
        self.field, self.message, self.help, self.file = field, message, help, file

    def diagnostic(self, config_path: str, config_text: str) -> Diagnostic:
        """The refusal as an error pointing at the field in config.json (at the file otherwise)."""
        if self.field:
            span = field_span(config_path, config_text, self.field)
            return next(check_expressible(self.field, self.message, span, self.help))
        return next(check_weights_match(self.message, Span(file=self.file), self.help))


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
