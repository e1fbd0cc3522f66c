"""Tokenizers the data pipeline accepts: raw UTF-8 bytes, or a local tokenizer folder.

A folder with `tokenizer.json` (what `save_pretrained` writes) loads through `tokenizers`; any
other folder through `transformers.AutoTokenizer(local_files_only=True)` when transformers is
installed. Nothing is downloaded. Each document is encoded with the tokenizer's special tokens
(its BOS, where its post-processor adds one) and ends with its EOS token when it has one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    vocab_size: int

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def describe(self) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes: ids 0..255, no special tokens (documents are delimited by `cu_seqlens`)."""

    vocab_size = 256

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def describe(self) -> str:
        return "bytes"


class FolderTokenizer:
    """A `tokenizers.Tokenizer` read from `<folder>/tokenizer.json`."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer as HFTokenizer

        self.folder = folder
        self.tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.eos = _eos_id(folder, self.tok.token_to_id)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [_with_eos(e.ids, self.eos) for e in self.tok.encode_batch(texts)]

    def describe(self) -> str:
        digest = hashlib.sha256((self.folder / "tokenizer.json").read_bytes()).hexdigest()[:16]
        return f"tokenizers:{self.folder.resolve()}:{digest}"


class TransformersTokenizer:
    """`transformers.AutoTokenizer` from a local folder (no network)."""

    def __init__(self, folder: Path):
        from transformers import AutoTokenizer

        self.folder = folder
        self.tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.vocab_size = len(self.tok)
        self.eos = self.tok.eos_token_id

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [_with_eos(ids, self.eos) for ids in self.tok(texts)["input_ids"]]

    def describe(self) -> str:
        files = sorted(p.name for p in self.folder.iterdir())
        return f"transformers:{self.folder.resolve()}:{','.join(files)}"


def load_tokenizer(folder: Path | None) -> Tokenizer:
    """Bytes for None, else the folder's tokenizer; ValueError naming what is missing."""
    if folder is None:
        return ByteTokenizer()
    if not folder.is_dir():
        raise ValueError(f"data.tokenizer: `{folder}` is not a folder (expected a saved tokenizer)")
    if (folder / "tokenizer.json").is_file():
        try:
            return FolderTokenizer(folder)
        except ModuleNotFoundError:
            raise ValueError("data.tokenizer needs `tokenizers` (`pip install 'lt2dsl[train]'`)") from None
        except Exception as e:  # the Rust library's parse errors are plain `Exception`s
            raise ValueError(
                f"data.tokenizer: `{folder / 'tokenizer.json'}` is not a tokenizer `tokenizers` can read: {e}"
            ) from e
    try:
        return TransformersTokenizer(folder)
    except ModuleNotFoundError:
        raise ValueError(
            f"data.tokenizer: `{folder}` has no tokenizer.json; other formats need transformers"
        ) from None
    except (OSError, ValueError) as e:
        raise ValueError(f"data.tokenizer: cannot load a tokenizer from `{folder}`: {e}") from None


def _eos_id(folder: Path, token_to_id) -> int | None:
    """The EOS id named by `tokenizer_config.json` (a string or {"content": ...}), if any."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return None
    eos = json.loads(path.read_text()).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return token_to_id(eos) if isinstance(eos, str) else None


def _with_eos(ids: list[int], eos: int | None) -> list[int]:
    if eos is None or (ids and ids[-1] == eos):
        return list(ids)
    return [*ids, eos]
