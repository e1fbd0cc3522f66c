"""`LT2ForCausalLM`: save_pretrained / AutoModelForCausalLM.from_pretrained round trip, `LT2Cache`
continuing a prefill, and the input checks (generate: test_generate.py)."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lt2dsl.hf import LT2Cache, LT2Config, LT2ForCausalLM, to_hf  # noqa: E402

from .util import HYBRID as SOURCE  # noqa: E402
from .util import hybrid_model, prompt  # noqa: E402


@pytest.fixture(scope="module")
def lt2_model():
    return hybrid_model()


def test_round_trip_through_auto_classes(lt2_model, tmp_path):
    to_hf(lt2_model).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "lt2" and saved["lt2_source"] == SOURCE
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(back, LT2ForCausalLM)
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(back(ids).logits, lt2_model(ids))


def test_cache_is_lt2s_and_continues_a_prefill(lt2_model):
    hf = to_hf(lt2_model).eval()
    ids = prompt()
    with torch.no_grad():
        first = hf(ids[:, :5], use_cache=True)
        cache = first.cache if hasattr(first, "cache") and first.cache is not None else first.past_key_values
        assert isinstance(cache, LT2Cache) and cache.get_seq_length() == 5
        rest = hf(ids[:, 5:], cache=cache).logits
        assert torch.allclose(rest, lt2_model(ids)[:, 5:], rtol=1e-5, atol=1e-6)


def test_padding_and_bad_configs_are_refused(lt2_model):
    hf = to_hf(lt2_model)
    ids = prompt()
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with pytest.raises(ValueError, match="padding"):
        hf(ids, attention_mask=mask)
    with pytest.raises(ValueError, match="backend"):
        LT2Config(lt2_source=SOURCE, backend="cuda")
    with pytest.raises(ValueError, match="lt2_source"):
        LT2ForCausalLM(LT2Config())
