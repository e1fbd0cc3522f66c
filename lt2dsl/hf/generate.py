"""HF `generate` for `LT2ForCausalLM`: lt2dsl's decode engine where it computes the same thing, HF's
own loop otherwise.

`LT2ForCausalLM.generate` hands `decode` to transformers as its `custom_generate` callable, so
transformers prepares the call as for any model (generation config, lengths, special tokens, logits
processors, stopping criteria) and `decode` runs the loop. The engine (`LT2Model.generate`) takes a
request whose processors are only temperature / top-k / top-p and whose stopping criteria are only
the length and eos tokens, with no outputs beyond the sequences and no cache of the caller's:
those it decodes greedily to HF's tokens (sampling draws the same distribution, from the
engine's own generator seeded by torch's global one); a left-padded batch runs as its unpadded
prompts, each decoded as it would be alone. Any other request (repetition penalty,
min_new_tokens, bad words, a caller's processors or criteria, `output_scores`, ...) runs HF's
`_sample` through `LT2Cache`. Beam search and assisted decoding are refused by transformers itself
(`LT2ForCausalLM._supported_generation_modes`).
"""

from __future__ import annotations

import torch
from transformers import GenerationMixin
from transformers.generation import (
    EosTokenCriteria,
    MaxLengthCriteria,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from lt2dsl.engine.request import MAX_STOPS

# Exact types: a subclass may change what the processor does.
ENGINE_PROCESSORS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
ENGINE_CRITERIA = (MaxLengthCriteria, EosTokenCriteria)
# Model kwargs the engine reads or needs nothing from (transformers drops an all-ones mask).
ENGINE_KWARGS = ("use_cache", "attention_mask")


def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
    """transformers' decoding loop for `model` (an `LT2ForCausalLM`): `[B, T]` prompts → `[B, T + n]`
    (rows that met an eos token padded with `pad_token_id`, as HF's loop pads them)."""
    if engine_refusal(logits_processor, stopping_criteria, generation_config, model_kwargs) is None:
        mask = model_kwargs.get("attention_mask")
        return _engine_generate(
            model, input_ids, mask, logits_processor, stopping_criteria, generation_config
        )
    return GenerationMixin._sample(
        model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs
    )


def engine_refusal(logits_processor, stopping_criteria, generation_config, model_kwargs) -> str | None:
    """Why the engine cannot decode this request as HF's loop would, or None when it can."""
    for p in logits_processor:
        if type(p) not in ENGINE_PROCESSORS:
            return f"logits processor {type(p).__name__}"
    for c in stopping_criteria:
        if type(c) not in ENGINE_CRITERIA:
            return f"stopping criterion {type(c).__name__}"
    if generation_config.return_dict_in_generate:
        return "return_dict_in_generate"
    eos = generation_config._eos_token_tensor
    if eos is not None and eos.numel() > MAX_STOPS:
        return f"more than {MAX_STOPS} eos tokens"
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not left_padded(mask):
        return "an attention mask other than left padding"
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in ENGINE_KWARGS)
    return f"model kwargs {', '.join(extra)}" if extra else None


def left_padded(mask: torch.Tensor) -> bool:
    """`mask [B, T]` is 0/1, each row zeros then ones, with at least its last token unmasked."""
    m = mask.to(torch.long)
    return mask.dim() == 2 and bool(
        ((m == 0) | (m == 1)).all() and (m[:, 1:] >= m[:, :-1]).all() and m[:, -1].all()
    )


def _engine_generate(model, input_ids, mask, logits_processor, stopping_criteria, generation_config):
    """`LT2Model.generate` for HF's request; a left-padded batch runs as its unpadded prompts
    (the engine takes prompts of any lengths) and comes back in HF's layout `[B, T + n]`."""
    lt2 = model.model
    ids = input_ids.to(lt2.embed.weight.device)
    pad = _first(generation_config._pad_token_tensor)
    kw = {
        "stop_tokens": _token_ids(generation_config._eos_token_tensor),
        "pad_token_id": pad,
        **_sampling(logits_processor, generation_config.do_sample),
    }
    n = _max_new_tokens(stopping_criteria, ids.shape[1])
    if mask is None:
        return lt2.generate(ids, n, **kw)
    prompts = [row[m.to(torch.bool)] for row, m in zip(ids, mask.to(ids.device), strict=True)]
    new = [out[len(p) :] for out, p in zip(lt2.generate(prompts, n, **kw), prompts, strict=True)]
    width = max(len(x) for x in new)
    # rows shorter than the longest ended at an eos token, so HF has a pad token for them
    tail = ids.new_full((len(new), width), pad if pad is not None else 0)
    for b, x in enumerate(new):
        tail[b, : len(x)] = x
    return torch.cat([ids, tail], dim=1)


def _max_new_tokens(stopping_criteria, prompt_len: int) -> int:
    """HF's length limit (the smallest `max_length` of its criteria) as new tokens."""
    limits = [c.max_length for c in stopping_criteria if isinstance(c, MaxLengthCriteria)]
    if not limits:
        raise ValueError("generate needs a length limit: give max_new_tokens or max_length")
    return max(min(limits) - prompt_len, 0)


def _sampling(logits_processor, do_sample: bool) -> dict:
    """The engine's temperature / top_k / top_p for HF's warpers (HF applies them in this order)."""
    if not do_sample:
        return {"temperature": 0.0}
    out = {"temperature": 1.0}
    for p in logits_processor:
        if isinstance(p, TemperatureLogitsWarper):
            out["temperature"] = float(p.temperature)
        elif isinstance(p, TopKLogitsWarper):
            out["top_k"] = int(p.top_k)
        elif isinstance(p, TopPLogitsWarper):
            out["top_p"] = float(p.top_p)
    return out


def _token_ids(t: torch.Tensor | None) -> list[int] | None:
    return None if t is None else [int(x) for x in t.reshape(-1).tolist()]


def _first(t: torch.Tensor | None) -> int | None:
    ids = _token_ids(t)
    return ids[0] if ids else None
