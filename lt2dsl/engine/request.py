"""Generate's arguments, checked up front: a bad one raises ValueError before anything runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lt2dsl.engine.sampling import Sampling, check_sampling

# Stop tokens a captured step compares against (a fixed-size device buffer, −1 padded).
MAX_STOPS = 16


@dataclass(frozen=True)
class Request:
    """One generate call: prompts `[T_b]` (int64 on the model's device) and how to continue them."""

    prompts: tuple[torch.Tensor, ...]
    max_new_tokens: int
    sampling: Sampling
    stops: tuple[int, ...]
    pad: int
    seed: int
    ragged: bool  # the prompts came as a list: the answer is a list of 1-D tensors

    @property
    def longest(self) -> int:
        """Tokens the longest row runs through the model: its prompt and all but the last new token."""
        return max(p.numel() for p in self.prompts) + self.max_new_tokens - 1


def check_request(model, input_ids, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None,
                  stop_tokens=None, pad_token_id=None, generator=None, seed=None) -> Request:  # fmt: skip
    """Every argument of `generate` checked against the model; ValueError naming what was expected."""
    if not model.config.head:
        raise ValueError("generate needs an LM head; this model has `head = none`")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    sampling = check_sampling(temperature, top_k, top_p)
    vocab = model.config.vocab
    stops = _token_list("stop_tokens", stop_tokens, vocab)
    if len(stops) > MAX_STOPS:
        raise ValueError(f"stop_tokens takes at most {MAX_STOPS} tokens, got {len(stops)}")
    pad = _token_list("pad_token_id", pad_token_id, vocab)
    if len(pad) > 1:
        raise ValueError(f"pad_token_id must be one token id, got {pad_token_id!r}")
    prompts, ragged = _prompts(model, input_ids)
    longest = max(p.numel() for p in prompts) + max_new_tokens - 1
    if model.max_len is not None and longest > model.max_len:
        raise ValueError(
            f"generate would run {longest} tokens (the longest prompt and all new tokens but the "
            f"last) but tmm's max_len={model.max_len} (the Toeplitz kernel length) is the longest it can mix"
        )
    # last: drawing the seed advances the caller's generator
    seed = _seed(generator, seed, sampling)
    return Request(prompts, max_new_tokens, sampling, stops, (pad or stops or (0,))[0], seed, ragged)


def _token_list(name: str, value, vocab: int) -> tuple[int, ...]:
    """None, one id or a sequence of ids, each an integer in [0, vocab)."""
    if value is None:
        return ()
    items = value if isinstance(value, list | tuple) else [value]
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < vocab:
            raise ValueError(f"{name} must be token ids in [0, {vocab}), got {value!r}")
    return tuple(items)


def _prompts(model, input_ids) -> tuple[tuple[torch.Tensor, ...], bool]:
    """A `[B, T]` tensor, or a list of 1-D tensors / lists of ids (prompts of any lengths)."""
    device = model.embed.weight.device
    if isinstance(input_ids, torch.Tensor):
        model.check_input(input_ids, None)
        return tuple(input_ids.to(torch.long)), False
    if not isinstance(input_ids, list | tuple) or not input_ids:
        raise ValueError(
            "input_ids must be a [B, T] tensor of token ids or a non-empty list of prompts (1-D tensors "
            f"or lists of ids), got {type(input_ids).__name__}"
        )
    rows = []
    for i, p in enumerate(input_ids):
        t = p if isinstance(p, torch.Tensor) else _ids_tensor(p, i)
        if t.dim() != 1 or t.numel() < 1:
            raise ValueError(
                f"prompt {i} must be a non-empty 1-D sequence of token ids, got shape {list(t.shape)}"
            )
        if t.device != device and isinstance(p, torch.Tensor):
            raise ValueError(f"prompt {i} must be on the model's device {device}, got {t.device}")
        rows.append(t.to(device))
    for t in rows:
        model.check_input(t[None], None)
    return tuple(t.to(torch.long) for t in rows), True


def _ids_tensor(p, i: int) -> torch.Tensor:
    if not isinstance(p, list | tuple) or not all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        raise ValueError(f"prompt {i} must be a 1-D tensor or a list of integer token ids, got {p!r}")
    return torch.tensor(p, dtype=torch.long)


def _seed(generator, seed, sampling: Sampling) -> int:
    """The seed of the engine's own generator: `seed`, else one draw from `generator` (advancing it,
    as sampling from it would), else one from torch's default generator; 0 when nothing is drawn."""
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        return seed
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if sampling.greedy:
        return 0
    dev = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 2**62, (), generator=generator, device=dev))
