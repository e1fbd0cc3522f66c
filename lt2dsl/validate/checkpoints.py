"""The codes of a refused checkpoint import (topic 10): `lt2dsl/hf/refuse.py` raises `Refused`,
shown through these rules. They live outside `lt2dsl.hf` so that `lt2dsl explain` and the docs
catalogue know them without importing `transformers`."""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic, error
from lt2dsl.source import Span
from lt2dsl.validate.rules import rule


@rule("E1001")
def check_expressible(field: str, message: str, span: Span, help_: str | None) -> Iterator[Diagnostic]:
    """Checkpoint feature `.lt2` cannot express.

    What it checks:
        `lt2dsl import` reads a checkpoint's config.json and refuses a setting no `.lt2` program
        can write: routed experts, RoPE scalings other than default / linear / llama3, logit
        soft-capping, MLP biases, fla options the layers lack (docs/hf.md lists them). The
        diagnostic points at the config field.

    Why it matters:
        Dropping the feature would import a different model whose outputs silently disagree
        with the checkpoint's; a refusal names what is missing instead.

    Example:
        $ lt2dsl import Qwen3-30B-A3B/      # config.json: "num_experts": 128

    Use instead:
        $ lt2dsl import Qwen3-8B/           # a dense checkpoint of a supported family
    """
    yield error("E1001", message, span, label=f"`{field}` is not supported", help=help_)


@rule("E1002")
def check_weights_match(message: str, span: Span, help_: str | None) -> Iterator[Diagnostic]:
    """Checkpoint folder or weights disagree with its config.

    What it checks:
        The folder holds a config.json and weights, and every stored tensor is one the config
        implies, with the shape it implies: no tensor left over, none missing.

    Why it matters:
        A tensor nothing claims would be dropped and a missing one left random; either way the
        imported model would not be the checkpoint. The import stops instead.

    Example:
        $ lt2dsl import my-llama/   # config.json: "intermediate_size": 64; the weights hold 48

    Use instead:
        $ lt2dsl import my-llama/   # config.json as saved with the weights
    """
    yield error("E1002", message, span, help=help_)
