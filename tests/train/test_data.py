"""Tokenising once into memmaps: text / JSONL / Parquet sources, bytes or a local tokenizer."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from lt2dsl.train.data import DataConfig, TokenFile, prepare
from lt2dsl.train.tokenize import ByteTokenizer, load_tokenizer


def text(tokens: np.ndarray) -> str:
    return tokens.astype(np.uint8).tobytes().decode()


def cfg(tmp_path, files, **kw) -> DataConfig:
    return DataConfig(train=files, cache=tmp_path / "cache", **kw)


def test_text_paragraphs_become_documents_and_a_val_split(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("first doc\n\nsecond\n\n\nthird one here")
    folder, vocab = prepare(cfg(tmp_path, [src], documents="paragraph", val_fraction=0.25), tmp_path, False)
    train, val = TokenFile(folder, "train"), TokenFile(folder, "val")
    stream = text(np.concatenate([train.view(), val.view()]))
    assert stream == "first docsecondthird one here"
    assert train.view().dtype == np.uint16 and vocab == 256
    assert train.starts.tolist() == [0, 9, 15]
    assert val.n_tokens == int(29 * 0.25) and val.starts.tolist() == [0]  # the cut splits "third"


def test_jsonl_and_parquet_read_the_text_field(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"text": "alpha", "id": 1}, {"text": "beta", "id": 2}]
    jl = tmp_path / "d.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pf = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["gamma", "delta"]}), pf)
    folder, _ = prepare(cfg(tmp_path, [jl, pf], val_fraction=0.0), tmp_path, False)
    train = TokenFile(folder, "train")
    assert text(train.view()) == "alphabetagammadelta"
    assert train.starts.tolist() == [0, 5, 9, 14]


def test_bad_sources_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected an object with a string `text` field"):
        prepare(cfg(tmp_path, [bad]), tmp_path, False)
    with pytest.raises(ValueError, match="unknown file type"):
        DataConfig(train=[tmp_path / "x.csv"])
    with pytest.raises(ValueError, match="does not exist"):
        prepare(cfg(tmp_path, [tmp_path / "missing.txt"]), tmp_path, False)
    if importlib.util.find_spec("pyarrow") is not None:
        junk = tmp_path / "junk.parquet"
        junk.write_bytes(b"junk")
        with pytest.raises(ValueError, match=r"junk\.parquet: not a Parquet file pyarrow can read"):
            prepare(cfg(tmp_path, [junk]), tmp_path, False)


def test_tokenised_once_and_again_when_a_source_changes(tmp_path, monkeypatch):
    src = tmp_path / "a.txt"
    src.write_text("hello world " * 20)
    calls = []
    encode = ByteTokenizer.encode_batch
    monkeypatch.setattr(ByteTokenizer, "encode_batch", lambda self, t: calls.append(1) or encode(self, t))
    first, _ = prepare(cfg(tmp_path, [src]), tmp_path, False)
    again, _ = prepare(cfg(tmp_path, [src]), tmp_path, False)
    assert first == again and len(calls) == 1
    src.write_text("changed text " * 20)
    changed, _ = prepare(cfg(tmp_path, [src]), tmp_path, False)
    assert changed != first and len(calls) == 2
    # a prepared folder is read as is by a later run
    reused = DataConfig(tokens=first, seq_len=4)
    assert prepare(reused, tmp_path / "elsewhere", False) == (first, 256) and len(calls) == 2
    with pytest.raises(ValueError, match="either `train`"):
        DataConfig(train=[src], tokens=first)


def tokenizer_folder(tmp_path, n_words: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(n_words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / f"tok{n_words}"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return folder


@pytest.mark.parametrize(("n_words", "dtype"), [(10, np.uint16), (2**16, np.uint32)])
def test_local_tokenizer_with_eos_and_the_token_width(tmp_path, n_words, dtype):
    pytest.importorskip("tokenizers")
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps({"text": "w0 w3 w9"}) + "\n" + json.dumps({"text": "w1 zzz"}) + "\n")
    folder, vocab = prepare(
        cfg(tmp_path, [src], tokenizer=tokenizer_folder(tmp_path, n_words), val_fraction=0), tmp_path, False
    )
    train = TokenFile(folder, "train")
    assert vocab == n_words + 2 and train.dtype == dtype
    assert train.view().tolist() == [2, 5, 11, 1, 3, 0, 1] and train.starts.tolist() == [0, 4]


def test_a_bad_tokenizer_folder_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer.json").write_text('{"x" 1}')
    with pytest.raises(ValueError, match=r"tokenizer\.json` is not a tokenizer `tokenizers` can read"):
        load_tokenizer(tmp_path)
