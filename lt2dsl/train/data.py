"""Data: local files tokenised once into a memory-mapped token file, or a synthetic task.

`prepare(cfg)` reads plain text, JSONL (one JSON object per line, `text_field` holding the text) and
Parquet (`text_field` column) files, tokenises every document (a local `tokenizers` /
`transformers` tokenizer folder, or raw bytes), and writes for each split:

    <cache>/<key>/train.bin  tokens, uint16 when the vocabulary fits in 2^16, else uint32 (nanoGPT)
    <cache>/<key>/train.docs.bin  int64 document starts (offsets into train.bin)
    <cache>/<key>/meta.json  dtype, token and document counts, tokenizer, vocab size (written last)

`<key>` hashes the sources (paths, sizes, modification times), the tokenizer and the split, so a
second run reads the memmaps without tokenising again, and an edited file is tokenised anew.
`tokens = "<folder>"` reads such a folder as is (tokenised once, trained on many times). A task
(`data = { task = "mqar", ... }`) is built by `lt2dsl.tasks.build` instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lt2dsl.train.files import atomic_write
from lt2dsl.train.tokenize import Tokenizer, load_tokenizer

STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)
SUFFIXES = (".txt", ".text", ".md", ".jsonl", ".json", ".parquet")


class DataConfig(BaseModel):
    """Local text files, tokenised once and packed into rows of `seq_len` tokens."""

    model_config = STRICT

    train: list[Path] = Field(default_factory=list)
    """Training files: `.txt` (also `.md`), `.jsonl` or `.parquet`; relative to the config file."""
    tokens: Path | None = None
    """Instead of `train`: a folder `prepare` wrote before (`meta.json`, `train.bin`, ...), read as is."""
    val: list[Path] = Field(default_factory=list)
    """Held-out files; when empty, the last `val_fraction` of the training tokens is held out."""
    val_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)
    """Share of the training tokens held out for evaluation when `val` is empty."""
    text_field: str = "text"
    """The JSONL key / Parquet column that holds a document's text."""
    documents: Literal["file", "paragraph", "line"] = "file"
    """How plain-text files split into documents: whole files, blank-line paragraphs, or lines."""
    tokenizer: Path | None = None
    """A local tokenizer folder (`tokenizer.json`, as `save_pretrained` writes it); None: UTF-8
    bytes (vocab 256)."""
    seq_len: int = Field(default=2048, gt=0)
    """Tokens per row."""
    pack_documents: bool = True
    """Keep documents apart inside a row (their starts reach the mixers as `cu_seqlens`, and a
    document's last token predicts nothing); False trains across document bounds (nanoGPT)."""
    cache: Path | None = None
    """Where the token files go; default `<training.out>/data`."""

    @field_validator("train", "val")
    @classmethod
    def _known_suffix(cls, paths: list[Path]) -> list[Path]:
        for p in paths:
            if p.suffix not in SUFFIXES:
                raise ValueError(f"`{p}`: unknown file type; expected one of {', '.join(SUFFIXES)}")
        return paths

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if bool(self.train) == (self.tokens is not None):
            raise ValueError("give either `train` (files to tokenise) or `tokens` (a prepared folder)")
        return self

    def rebase(self, root: Path) -> DataConfig:
        def at(p):
            return p if p is None or p.is_absolute() else root / p

        return self.model_copy(
            update={
                "train": [at(p) for p in self.train],
                "val": [at(p) for p in self.val],
                "tokenizer": at(self.tokenizer),
                "tokens": at(self.tokens),
                "cache": at(self.cache),
            }
        )


class TaskDataConfig(BaseModel):
    """A synthetic task of `lt2dsl.tasks` (`task` names it; the other keys are the task's own)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    task: str
    """The task's name, e.g. `mqar`; `lt2dsl.tasks.build` checks it and the other keys."""

    def rebase(self, root: Path) -> TaskDataConfig:
        return self

    def task_dict(self) -> dict[str, Any]:
        return self.model_dump()


# ---- reading documents ---------------------------------------------------------------------------


def documents(path: Path, cfg: DataConfig) -> Iterator[str]:
    """The documents of one file, in order."""
    if not path.is_file():
        raise ValueError(f"data file `{path}` does not exist")
    if path.suffix == ".parquet":
        yield from _parquet(path, cfg.text_field)
    elif path.suffix in (".jsonl", ".json"):
        yield from _jsonl(path, cfg.text_field)
    else:
        yield from _text(path, cfg.documents)


def _text(path: Path, how: str) -> Iterator[str]:
    text = path.read_text(encoding="utf-8")
    if how == "file":
        parts = [text]
    elif how == "line":
        parts = text.splitlines()
    else:
        parts = [p.strip("\n") for p in text.replace("\r\n", "\n").split("\n\n")]
    yield from (p for p in parts if p.strip())


def _jsonl(path: Path, field: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON object: {e.msg}") from None
            if not isinstance(row, dict) or not isinstance(row.get(field), str):
                raise ValueError(f"{path}:{i}: expected an object with a string `{field}` field")
            yield row[field]


def _parquet(path: Path, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise ValueError("reading Parquet needs pyarrow (`pip install 'lt2dsl[train]'`)") from None
    import pyarrow

    try:
        pf = pq.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a Parquet file pyarrow can read: {e}") from e
    if field not in pf.schema_arrow.names:
        raise ValueError(f"{path}: no column `{field}` (columns: {', '.join(pf.schema_arrow.names)})")
    for batch in pf.iter_batches(columns=[field]):
        yield from (t for t in batch.column(0).to_pylist() if t)


# ---- the token files ---------------------------------------------------------------------------


def has_split(folder: Path, split: str) -> bool:
    return json.loads((folder / "meta.json").read_text()).get(split) is not None


class TokenFile:
    """A tokenised split: `tokens` (memmap, reopened on each `view`) and document starts `[N]`."""

    def __init__(self, folder: Path, split: str):
        meta = json.loads((folder / "meta.json").read_text())[split]
        self.path, self.dtype = folder / f"{split}.bin", np.dtype(meta["dtype"])
        self.n_tokens = int(meta["tokens"])
        self.starts = np.fromfile(folder / f"{split}.docs.bin", dtype=np.int64)

    def view(self) -> np.ndarray:
        """The tokens `[n_tokens]` as a fresh read-only memmap (nanoGPT reopens it per batch so
        the pages it read do not pile up in the process)."""
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.n_tokens,))


def prepare(cfg: DataConfig, default_cache: Path, progress: bool = True) -> tuple[Path, int]:
    """Tokenise the sources once; returns the folder holding `train.*`, `val.*` and `meta.json`,
    and the vocabulary size the tokens come from."""
    if cfg.tokens is not None:
        return cfg.tokens, _prepared_vocab(cfg.tokens)
    tok = load_tokenizer(cfg.tokenizer)
    folder = (cfg.cache or default_cache) / _key(cfg, tok)
    if (folder / "meta.json").is_file():
        return folder, tok.vocab_size
    folder.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    meta: dict[str, Any] = {"tokenizer": tok.describe(), "vocab_size": tok.vocab_size}
    train = _write(folder, "train", _all_docs(cfg.train, cfg), tok, dtype, progress)
    if cfg.val:
        meta["train"] = train
        meta["val"] = _write(folder, "val", _all_docs(cfg.val, cfg), tok, dtype, progress)
    elif cfg.val_fraction > 0:
        meta["train"], meta["val"] = _split_off(folder, train, cfg.val_fraction, dtype)
    else:
        meta["train"], meta["val"] = train, None
    atomic_write(folder / "meta.json", json.dumps(meta, indent=1))
    return folder, tok.vocab_size


def _prepared_vocab(folder: Path) -> int:
    path = folder / "meta.json"
    if not path.is_file():
        raise ValueError(f"data.tokens: `{folder}` has no meta.json (not a prepared token folder)")
    meta = json.loads(path.read_text())
    if "train" not in meta or "vocab_size" not in meta:
        raise ValueError(f"data.tokens: `{path}` lacks `train` or `vocab_size`")
    return int(meta["vocab_size"])


def _all_docs(paths: list[Path], cfg: DataConfig) -> Iterator[str]:
    for p in paths:
        yield from documents(p, cfg)


def _key(cfg: DataConfig, tok: Tokenizer) -> str:
    parts = [tok.describe(), cfg.text_field, cfg.documents, str(cfg.val_fraction)]
    for p in [*cfg.train, *cfg.val]:
        st = p.stat() if p.exists() else None
        parts.append(f"{p.resolve()}:{st.st_size if st else -1}:{st.st_mtime_ns if st else -1}")
    parts.append(f"val={len(cfg.val)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _write(folder: Path, split: str, docs: Iterator[str], tok: Tokenizer, dtype, progress: bool) -> dict:
    """Stream documents into `<split>.bin` / `<split>.docs.bin` (temp names, then renamed)."""
    from rich.progress import Progress

    n, starts = 0, []
    tmp = folder / f"{split}.bin.tmp"
    with tmp.open("wb") as f, Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task(f"tokenising {split}", total=None)
        for batch in _batches(docs, 256):
            for ids in tok.encode_batch(batch):
                if len(ids) == 0:
                    continue
                starts.append(n)
                np.asarray(ids, dtype=dtype).tofile(f)
                n += len(ids)
            bar.update(task, advance=len(batch))
    if n < 2:
        raise ValueError(f"the {split} files hold {n} tokens: nothing to train on")
    os.replace(tmp, folder / f"{split}.bin")
    atomic_write(folder / f"{split}.docs.bin", np.asarray(starts, dtype=np.int64).tobytes())
    return {"dtype": np.dtype(dtype).name, "tokens": n, "documents": len(starts)}


def _batches(it: Iterator[str], size: int) -> Iterator[list[str]]:
    batch = []
    for x in it:
        batch.append(x)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _split_off(folder: Path, train: dict, fraction: float, dtype) -> tuple[dict, dict]:
    """Move the last `fraction` of the training tokens into the val split (a document crossing
    the cut becomes two)."""
    n = train["tokens"]
    cut = n - max(2, int(n * fraction))
    if cut < 2:
        raise ValueError(f"{n} training tokens are too few to hold out val_fraction={fraction}")
    tokens = np.fromfile(folder / "train.bin", dtype=dtype)
    starts = np.fromfile(folder / "train.docs.bin", dtype=np.int64)
    val_starts = np.concatenate([[0], starts[starts > cut] - cut]).astype(np.int64)
    atomic_write(folder / "val.bin", tokens[cut:].tobytes())
    atomic_write(folder / "val.docs.bin", val_starts.tobytes())
    atomic_write(folder / "train.bin", tokens[:cut].tobytes())
    atomic_write(folder / "train.docs.bin", starts[starts < cut].tobytes())
    name = np.dtype(dtype).name
    return (
        {"dtype": name, "tokens": int(cut), "documents": int((starts < cut).sum())},
        {"dtype": name, "tokens": int(n - cut), "documents": len(val_starts)},
    )
