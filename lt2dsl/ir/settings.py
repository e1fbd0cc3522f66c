"""Schemas of the model settings and of the loop options (what `model { }` and `loop` accept)."""

from __future__ import annotations

from lt2dsl.dtypes import DEFAULT_DTYPE, DEFAULT_STATE_DTYPE, SETTING_DTYPES
from lt2dsl.ir.spec import Option

MODEL_SETTINGS = (
    Option("dim", "int", "model width d_model (required unless given with --set)", min=1, required=True),
    Option("vocab", "int", "vocabulary size", default=32000, min=1),
    Option("heads", "int", "default heads of every mixer that has heads [max(1, dim / 128)]", min=1),
    Option("head_dim", "int", "default head dim [dim / heads]", min=1),
    Option("kv_heads", "int", "default key/value heads of attention mixers [heads]", min=1),
    Option("mlp", "mlp", "default channel mixer [swiglu]"),
    Option("norm", "norm", "default block norm [rmsnorm(eps=1e-6)]"),
    Option(
        "max_len", "size", "default sequence length for estimates; tmm's kernel length", default=8192, min=1
    ),
    Option("tie_embeddings", "bool", "share the LM head with the token embedding", default=True),
    Option("embed_scale", "bool", "multiply the token embeddings by sqrt(dim) (Gemma)", default=False),
    Option(
        "head",
        "enum",
        "`lm` (logits) or `none` (a backbone returning hidden states)",
        default="lm",
        choices=("lm", "none"),
    ),
    Option("dtype", "enum", "weights and activations", default=DEFAULT_DTYPE, choices=SETTING_DTYPES),
    Option("state_dtype", "enum", "recurrent states", default=DEFAULT_STATE_DTYPE, choices=SETTING_DTYPES),
)

# Overrides that are no model setting: `--set loop.T=8` (`loop_T=8` from Python) sets every loop's T.
LOOP_T_KEYS = ("loop.T", "loop_T")

LOOP_OPTIONS = (
    Option(
        "final_norm",
        "bool",
        "apply the final norm after every iteration and feed it on (Ouro)",
        default=False,
    ),
    Option(
        "inject",
        "enum",
        "re-inject the embedding each iteration (`concat`: + a linear adapter)",
        default="none",
        choices=("none", "add", "concat"),
    ),
    Option(
        "exit",
        "enum",
        "`none` or `gate(threshold=0.9)`: Ouro's learned exit gate",
        default="none",
        choices=("none", "gate"),
    ),
    Option("norm", "norm", "block norm of the loop's blocks (e.g. `sandwich`, Ouro's form)"),
)

EXIT_GATE_OPTIONS = (
    Option(
        "threshold",
        "float",
        "cumulative exit probability at which a token stops",
        default=0.9,
        min=0,
        max=1,
        min_open=True,
    ),
)
