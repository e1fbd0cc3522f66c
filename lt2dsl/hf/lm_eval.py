"""An lm-evaluation-harness model over an `LT2ForCausalLM` / `LT2Model` (`lm_eval.api.model.LM`).

    from lt2dsl.hf.lm_eval import LT2LM
    lm = LT2LM(model, tokenizer)            # a model from `lt2dsl.from_pretrained` or an LT2ForCausalLM
    lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"])

Requests are scored one at a time without padding (lt2dsl's caches have no padding mask):
`loglikelihood` sums the log-probabilities of the continuation's tokens given the context and
says whether each was the greedy choice; `loglikelihood_rolling` scores a whole text in windows
of `max_length` tokens; `generate_until` decodes greedily until a stop string or `max_gen_toks`.
lm-eval is an optional dependency: without it, `LT2LM` keeps the same interface on `object`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    from lm_eval.api.model import LM as _Base
except ImportError:
    _Base = object


class LT2LM(_Base):
    """Args:
    model: an `LT2Model` (or an `LT2ForCausalLM`, whose `.model` is used).
    tokenizer: a tokenizer with `encode(text) -> list[int]` and `decode(ids) -> str` (HF's
        `add_special_tokens` is left to the tokenizer's defaults).
    max_length (int, Optional): longest scored window. Default: the model's `max_len`.
    max_gen_toks (int, Optional): default generation budget. Default: 256.
    """

    def __init__(self, model, tokenizer, max_length: int | None = None, max_gen_toks: int = 256):
        if _Base is not object:
            super().__init__()
        self.model = getattr(model, "model", model).eval()
        self.tokenizer = tokenizer
        self.max_length = int(max_length or self.model.config.max_len)
        self.max_gen_toks = max_gen_toks

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    @torch.no_grad()
    def _scores(self, ids: list[int], n_cont: int) -> tuple[float, bool]:
        """(log P of the last `n_cont` tokens of `ids` given the rest, all of them greedy)."""
        ids = ids[-(self.max_length + 1) :]
        x = torch.tensor([ids[:-1]], device=self.device)
        logp = F.log_softmax(self.model(x)[0, -n_cont:].float(), dim=-1)  # [n_cont, vocab]
        target = torch.tensor(ids[-n_cont:], device=self.device)
        ll = logp.gather(-1, target[:, None]).sum()
        return float(ll), bool((logp.argmax(-1) == target).all())

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        out = []
        for req in requests:
            context, continuation = req.args if hasattr(req, "args") else req
            ctx, cont = self._encode(context), self._encode(continuation)
            if not ctx:  # score the first continuation token from the tokenizer's BOS / EOS
                ctx = [self._prefix_token()]
            out.append(self._scores(ctx + cont, len(cont)))
        return out

    def loglikelihood_rolling(self, requests) -> list[float]:
        out = []
        for req in requests:
            (text,) = req.args if hasattr(req, "args") else req
            ids = [self._prefix_token(), *self._encode(text)]
            total, start = 0.0, 1
            while start < len(ids):
                end = min(len(ids), start + self.max_length)
                window = ids[max(0, end - self.max_length - 1) : end]
                total += self._scores(window, end - start)[0]
                start = end
            out.append(total)
        return out

    @torch.no_grad()
    def generate_until(self, requests) -> list[str]:
        out = []
        for req in requests:
            context, kwargs = req.args if hasattr(req, "args") else req
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            budget = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            x = torch.tensor([self._encode(context)[-self.max_length :]], device=self.device)
            ids = self.model.generate(x, budget)[0, x.shape[1] :].tolist()
            text = self.tokenizer.decode(ids)
            cut = min((text.index(s) for s in until if s in text), default=len(text))
            out.append(text[:cut])
        return out

    def _prefix_token(self) -> int:
        for name in ("bos_token_id", "eos_token_id"):
            tok = getattr(self.tokenizer, name, None)
            if tok is not None:
                return int(tok)
        raise ValueError("the tokenizer has neither bos_token_id nor eos_token_id to start an empty context")
