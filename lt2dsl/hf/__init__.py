"""Checkpoints in and out (`docs/hf.md`): import Hugging Face / fla checkpoints as `.lt2` models, and
`LT2Config` / `LT2ForCausalLM`, an lt2dsl model as a `transformers` model.

Importing this package registers `model_type = "lt2"` with `AutoConfig` and
`AutoModelForCausalLM`, so `AutoModelForCausalLM.from_pretrained(dir)` of a saved LT2 model returns
an `LT2ForCausalLM`. The compiler never imports this package.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM

from lt2dsl.hf.importer import Imported, from_pretrained, import_checkpoint
from lt2dsl.hf.modeling import LT2Cache, LT2Config, LT2ForCausalLM, to_hf
from lt2dsl.hf.refuse import Refused

AutoConfig.register("lt2", LT2Config, exist_ok=True)
AutoModelForCausalLM.register(LT2Config, LT2ForCausalLM, exist_ok=True)

__all__ = [
    "Imported",
    "LT2Cache",
    "LT2Config",
    "LT2ForCausalLM",
    "Refused",
    "from_pretrained",
    "import_checkpoint",
    "to_hf",
]
