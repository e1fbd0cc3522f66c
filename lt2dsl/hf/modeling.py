"""`LT2Config` / `LT2ForCausalLM`: an lt2dsl model as a `transformers` model (`model_type = "lt2"`).

The config holds the `.lt2` source; the model compiles it into an `LT2Model` (`self.model`), so
`save_pretrained` writes config.json (with the source) and the `LT2Model`'s parameters as
safetensors under `model.*`, and `from_pretrained` reads them back. `generate` decodes through
lt2dsl's engine where the request is one it runs as HF would (`lt2dsl/hf/generate.py`), otherwise
through HF's loop over `LT2Cache`, a `transformers.Cache` that wraps lt2dsl's own `Cache`
(recurrent states, KV caches per (iteration, block)); only unpadded batches are taken (lt2dsl
caches have no padding mask).
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache as HFCache
from transformers.generation import GenerationMode
from transformers.modeling_outputs import CausalLMOutputWithPast

from lt2dsl.hf.generate import decode
from lt2dsl.lowering.cache import Cache
from lt2dsl.lowering.model import BACKENDS


class LT2Config(PretrainedConfig):
    """Configuration of an `LT2ForCausalLM`: the `.lt2` program and the kernel backend.

    Args:
        lt2_source (str): the `.lt2` program text.
        backend (str, Optional): "reference", "triton" or "auto". Default: "auto".
        use_cache (bool, Optional): decode through an `LT2Cache`. Default: True.
    """

    model_type = "lt2"

    def __init__(self, lt2_source: str = "", backend: str = "auto", use_cache: bool = True, **kwargs):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if not isinstance(lt2_source, str):
            raise ValueError(f"lt2_source must be .lt2 text (a str), got {type(lt2_source).__name__}")
        self.lt2_source = lt2_source
        self.backend = backend
        self.use_cache = use_cache
        # The LT2Model ties its head itself (`tie_embeddings`): transformers must not tie again.
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)
        if lt2_source:
            cfg = _resolved(lt2_source).config
            self.vocab_size, self.hidden_size = cfg.vocab, cfg.dim


def _resolved(source: str):
    from lt2dsl.frontend import load_or_raise

    return load_or_raise(source).model


class LT2Cache(HFCache):
    """A `transformers.Cache` over lt2dsl's `Cache` (`inner`): one entry per (iteration, block)
    application, updated in place by the model; HF sees only its length."""

    def __init__(self, inner: Cache):
        super().__init__(layers=[])
        self.inner = inner

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.inner.seen

    @property
    def is_compileable(self) -> bool:
        return False

    def reset(self) -> None:
        self.inner.reset()

    def _unsupported(self, *args, **kwargs):
        raise NotImplementedError("LT2Cache supports greedy and sampled decoding only (no beams or cropping)")

    reorder_cache = crop = batch_repeat_interleave = batch_select_indices = _unsupported


class LT2ForCausalLM(PreTrainedModel, GenerationMixin):
    """An `LT2Model` behind the `transformers` causal-LM interface.

    `forward(input_ids [B, T], attention_mask=None, cache=None, labels=None) → logits [B, T, vocab]`
    (and the cross-entropy loss with `labels`); `cache` (`past_key_values` in older transformers)
    is an `LT2Cache`, made on the first call when `use_cache`.
    """

    config_class = LT2Config
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True
    _supports_cache_class = True
    # transformers refuses beam search, assisted decoding and the rest with a ValueError naming the mode.
    _supported_generation_modes = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)

    def __init__(self, config: LT2Config):
        super().__init__(config)
        from lt2dsl.lowering import compile_model

        if not config.lt2_source:
            raise ValueError("LT2Config.lt2_source is empty: give the .lt2 program text")
        self.model = compile_model(config.lt2_source, backend=config.backend, dtype=torch.get_default_dtype())
        self.post_init()

    def _init_weights(self, module) -> None:
        """The LT2Model initialises itself (`LT2Model.reset_parameters`); nothing to redo here."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def get_input_embeddings(self):
        return self.model.embed

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        cache: LT2Cache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        past_key_values: LT2Cache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        cache = cache if cache is not None else past_key_values
        _check_mask(attention_mask)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cache is not None and not isinstance(cache, LT2Cache):
            if cache.get_seq_length() != 0:
                raise ValueError(f"cache must be an LT2Cache, got {type(cache).__name__}")
            cache = None  # an empty cache of another kind: replaced by ours
        if cache is None and use_cache:
            cache = LT2Cache(self.model.new_cache(input_ids.shape[0]))
        logits = self.model(input_ids, cache.inner if cache is not None else None)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=logits.shape[-1])
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, **kwargs):
        """HF `generate`, its loop run by `lt2dsl.hf.generate.decode`: lt2dsl's engine for the greedy
        and temperature / top-k / top-p requests it decodes as HF would, HF's own loop for the rest.

        A caller's `custom_generate`, and `streamer` / `synced_gpus` (which transformers does not
        pass to a `custom_generate` callable), keep HF's own path.
        """
        if any(kwargs.get(k) is not None for k in ("custom_generate", "streamer", "synced_gpus")):
            return super().generate(inputs, generation_config, **kwargs)
        return super().generate(inputs, generation_config, custom_generate=decode, **kwargs)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, **kwargs) -> dict:
        """The tokens the cache has not seen yet (all of them on the first step)."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        seen = cache.get_seq_length() if cache is not None else 0
        inputs = {"input_ids": input_ids[:, seen:], "use_cache": kwargs.get("use_cache")}
        inputs["attention_mask"] = kwargs.get("attention_mask")
        if cache is not None:
            inputs[_CACHE_FIELD] = cache
        return inputs


_CACHE_FIELD = next(
    (f.name for f in dataclasses.fields(CausalLMOutputWithPast) if f.name in ("cache", "past_key_values")),
    "past_key_values",
)


def _check_mask(mask: torch.Tensor | None) -> None:
    if mask is not None and not bool(mask.all()):
        raise ValueError(
            "LT2ForCausalLM's forward takes no padding (lt2dsl caches have no padding mask): pass "
            "unpadded rows of equal length, or one row at a time; generate takes left padding where "
            "lt2dsl's engine decodes the request (docs/hf.md)"
        )


def to_hf(model, backend: str | None = None) -> LT2ForCausalLM:
    """An `LT2ForCausalLM` sharing the parameters of a compiled `LT2Model` (which must carry its
    `.lt2` source as `lt2_source`, as `lt2dsl.from_pretrained` models do)."""
    source = getattr(model, "lt2_source", None)
    if not source:
        raise ValueError("the LT2Model has no `lt2_source`: compile it from .lt2 text or import a checkpoint")
    config = LT2Config(lt2_source=source, backend=backend or model.backend)
    config.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    hf = LT2ForCausalLM.__new__(LT2ForCausalLM)
    PreTrainedModel.__init__(hf, config)
    hf.model = model
    hf.post_init()
    return hf
