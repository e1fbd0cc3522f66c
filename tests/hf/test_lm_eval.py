"""`LT2LM`, the lm-eval harness model, with a toy tokenizer (one character = one token): its scores
equal log-softmax sums computed by hand from the model's logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import lt2dsl
from lt2dsl.hf.lm_eval import LT2LM

SOURCE = (
    "model m {\n  dim = 32\n  vocab = 64\n  heads = 2\n  max_len = 16\n  dtype = fp32\n"
    "  full\n  gdn(expand_v=1)\n}\n"
)


class CharTokenizer:
    bos_token_id = 1

    def encode(self, text):
        return [2 + (ord(c) - ord("a")) % 60 for c in text]

    def decode(self, ids):
        return "".join(chr(ord("a") + (i - 2) % 60) for i in ids)


def make():
    torch.manual_seed(0)
    model = lt2dsl.compile(SOURCE, backend="reference", dtype="fp32").eval()
    return model, LT2LM(model, CharTokenizer())


def by_hand(model, ids, n_cont):
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([ids[:-1]]))[0], -1)
    return float(sum(logp[len(ids) - 1 - n_cont + i, ids[len(ids) - n_cont + i]] for i in range(n_cont)))


def test_loglikelihood_sums_the_continuation():
    model, lm = make()
    tok = CharTokenizer()
    (ll, greedy), (ll_empty, _) = lm.loglikelihood([("abc", "de"), ("", "a")])
    assert abs(ll - by_hand(model, tok.encode("abcde"), 2)) < 1e-5
    assert abs(ll_empty - by_hand(model, [1, *tok.encode("a")], 1)) < 1e-5
    assert isinstance(greedy, bool)


def test_rolling_windows_cover_every_token_once():
    model, lm = make()
    text = "abcdefghijklmnopqrstuvwxyz"  # 27 tokens with BOS: two windows of max_len 16
    ids = [1, *CharTokenizer().encode(text)]
    expected = by_hand(model, ids[:17], 16) + by_hand(model, ids[10:], 10)
    assert abs(lm.loglikelihood_rolling([(text,)])[0] - expected) < 1e-4


def test_generate_until_stops_at_the_stop_string():
    model, lm = make()
    full = lm.generate_until([("abc", {"max_gen_toks": 6})])[0]
    assert len(full) == 6
    cut = lm.generate_until([("abc", {"until": [full[2]], "max_gen_toks": 6})])[0]
    assert cut == full[: full.index(full[2])]
