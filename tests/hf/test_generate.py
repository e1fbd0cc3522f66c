"""HF `generate` of `LT2ForCausalLM`: the engine's tokens for the requests it takes (equal to
`LT2Model.generate` and to HF's own loop; left-padded batches too), HF's loop for the rest,
refusals for beams."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import GenerationMixin  # noqa: E402
from transformers.generation import GenerateDecoderOnlyOutput  # noqa: E402

from lt2dsl.hf import to_hf  # noqa: E402

from .util import hybrid_model, prompt  # noqa: E402

N = 6


@pytest.fixture(scope="module")
def lt2_model():
    return hybrid_model()


@pytest.fixture
def engine_calls(lt2_model, monkeypatch):
    """The keyword arguments of every `LT2Model.generate` call (the engine's entry)."""
    calls, real = [], type(lt2_model).generate

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(lt2_model), "generate", spy)
    return calls


def hf_loop(hf, ids, **kwargs) -> torch.Tensor:
    """HF's own decoding loop (`GenerationMixin.generate`, through `LT2Cache`)."""
    return GenerationMixin.generate(hf, ids, max_new_tokens=N, **kwargs)


def test_greedy_runs_the_engine_and_equals_both_loops(lt2_model, engine_calls):
    hf, ids = to_hf(lt2_model).eval(), prompt()
    out = hf.generate(ids, max_new_tokens=N, do_sample=False)
    assert len(engine_calls) == 1 and engine_calls[0]["temperature"] == 0.0
    assert out.shape == (2, ids.shape[1] + N)
    assert torch.equal(out, hf_loop(hf, ids, do_sample=False))
    assert torch.equal(out, lt2_model.generate(ids, N))


def test_eos_stops_rows_and_pads_as_hfs_loop(lt2_model, engine_calls):
    hf, ids = to_hf(lt2_model).eval(), prompt(seed=1)
    free = hf_loop(hf, ids, do_sample=False)[:, ids.shape[1] :]
    eos = int(free[0, 1])
    assert eos not in free[1].tolist(), "the test needs a token that ends row 0 only"
    out = hf.generate(ids, max_new_tokens=N, do_sample=False, eos_token_id=eos, pad_token_id=3)
    assert engine_calls[-1]["stop_tokens"] == [eos] and engine_calls[-1]["pad_token_id"] == 3
    ref = hf_loop(hf, ids, do_sample=False, eos_token_id=eos, pad_token_id=3)
    assert torch.equal(out, ref)
    assert out[0, ids.shape[1] + 2 :].eq(3).all()


def test_sampling_runs_the_engine_with_hfs_warpers(lt2_model, engine_calls):
    hf, ids = to_hf(lt2_model).eval(), prompt()
    torch.manual_seed(7)
    out = hf.generate(ids, max_new_tokens=N, do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
    assert engine_calls[-1] == {
        "stop_tokens": None, "pad_token_id": None, "temperature": 0.7, "top_k": 5, "top_p": 0.9,
    }  # fmt: skip
    torch.manual_seed(7)
    assert torch.equal(out, lt2_model.generate(ids, N, temperature=0.7, top_k=5, top_p=0.9))


def test_other_requests_run_hfs_loop(lt2_model, engine_calls):
    hf, ids = to_hf(lt2_model).eval(), prompt()
    free = lt2_model.generate(ids, N)
    engine_calls.clear()
    banned = sorted(set(free[:, ids.shape[1] :].reshape(-1).tolist()))
    out = hf.generate(ids, max_new_tokens=N, do_sample=False, suppress_tokens=banned)
    assert torch.equal(out, hf_loop(hf, ids, do_sample=False, suppress_tokens=banned))
    assert not set(out[:, ids.shape[1] :].reshape(-1).tolist()) & set(banned)
    res = hf.generate(ids, max_new_tokens=N, return_dict_in_generate=True, output_scores=True)
    assert isinstance(res, GenerateDecoderOnlyOutput) and len(res.scores) == N
    assert torch.equal(res.sequences, free)
    assert engine_calls == []


def test_a_left_padded_batch_decodes_each_prompt_as_alone(lt2_model, engine_calls):
    hf, ids, pad = to_hf(lt2_model).eval(), prompt(), 1
    short = ids[1, 3:]
    padded = torch.stack([ids[0], torch.cat([torch.full((3,), pad), short])])
    mask = (torch.arange(ids.shape[1]) >= torch.tensor([[0], [3]])).long()
    alone = [hf_loop(hf, row[None], do_sample=False)[0, -N:] for row in (ids[0], short)]
    eos = next(t for t in alone[1].tolist() if t not in alone[0].tolist())  # ends row 1 only
    k = alone[1].tolist().index(eos) + 1  # row 1's new tokens, its eos included
    out = hf.generate(padded, attention_mask=mask, max_new_tokens=N, do_sample=False, eos_token_id=eos,
                      pad_token_id=pad)  # fmt: skip
    assert len(engine_calls) == 1
    assert torch.equal(out[:, : ids.shape[1]], padded)
    assert torch.equal(out[0, ids.shape[1] :], alone[0])
    assert out[1, ids.shape[1] :].tolist() == alone[1][:k].tolist() + [pad] * (N - k)
    with pytest.raises(ValueError, match="padding"):  # right padding: HF's loop, which refuses it
        hf.generate(padded, attention_mask=mask.flip(1), max_new_tokens=N, do_sample=False)


def test_beams_are_refused(lt2_model):
    with pytest.raises(ValueError, match="only supports"):
        to_hf(lt2_model).generate(prompt(), max_new_tokens=2, num_beams=2)
