"""Packed rows, their `cu_seqlens` and labels; a resumable order that no process count changes."""

from __future__ import annotations

import json

import numpy as np
import torch

from lt2dsl.train.data import TokenFile
from lt2dsl.train.loader import IGNORE, Shard, TaskLoader, TokenLoader


def token_file(tmp_path, lengths=(5, 3, 9, 4, 7)) -> TokenFile:
    """Documents of the given lengths; token values are their stream positions (mod 2^16)."""
    n = sum(lengths)
    np.arange(n, dtype=np.uint16).tofile(tmp_path / "train.bin")
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    starts.tofile(tmp_path / "train.docs.bin")
    (tmp_path / "meta.json").write_text(
        json.dumps({"train": {"dtype": "uint16", "tokens": n, "documents": len(lengths)}})
    )
    return TokenFile(tmp_path, "train")


def test_packed_row_carries_document_starts_and_masks_document_ends(tmp_path):
    f = token_file(tmp_path)  # documents start at 0, 5, 8, 17, 21; 28 tokens
    loader = TokenLoader(f, seq_len=6, shard=Shard(micro=2, accum=1), seed=0, pack=True)
    b = loader.batch(np.array([1, 2]))  # rows [6, 13) and [12, 19): inputs 6..11 and 12..17
    assert b.input_ids.tolist() == [[6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
    assert b.cu_seqlens.tolist() == [0, 2, 6, 11, 12]  # doc starts 8 and 17 inside, row bounds
    labels = b.labels[0].tolist()
    assert labels[:6] == [7, IGNORE, 9, 10, 11, 12]  # 7 ends a document (8 starts one)
    assert labels[6:] == [13, 14, 15, 16, IGNORE, 18]  # 16 ends a document (17 starts one)


def test_rows_that_are_whole_sequences_stay_unpacked(tmp_path):
    """No document starts inside any row: `[R, T]` without `cu_seqlens` (the same sequences as a
    packed row cut at the row bounds: tests/lowering/test_packed.py), a row whose next token
    starts a document still masked; one inner start packs the micro-batch."""
    loader = TokenLoader(token_file(tmp_path, lengths=(12, 17)), 6, Shard(micro=2, accum=1), 0, pack=True)
    b = loader.batch(np.array([0, 1]))  # inputs 0..5 and 6..11; 12 starts the second document
    assert b.cu_seqlens is None and b.input_ids.tolist() == [list(range(6)), list(range(6, 12))]
    assert b.labels.tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, IGNORE]]
    b = loader.batch(np.array([2, 3]))  # inputs 12..17 and 18..23, one document
    assert b.cu_seqlens is None and b.labels.tolist() == [list(range(13, 19)), list(range(19, 25))]
    packed = TokenLoader(token_file(tmp_path, lengths=(10, 19)), 6, Shard(micro=2, accum=1), 0, pack=True)
    b = packed.batch(np.array([0, 1]))  # 10 starts a document inside the second row
    assert b.input_ids.shape == (1, 12) and b.cu_seqlens.tolist() == [0, 6, 10, 12]


def test_unpacked_rows_predict_across_documents(tmp_path):
    loader = TokenLoader(token_file(tmp_path), 6, Shard(micro=2, accum=1), 0, pack=False)
    b = loader.batch(np.array([0, 3]))
    assert b.cu_seqlens is None and b.input_ids.shape == (2, 6)
    assert b.labels.tolist() == [[1, 2, 3, 4, 5, 6], [19, 20, 21, 22, 23, 24]]


def rows_of(batches) -> list[int]:
    return sorted(int(x) for b in batches for x in b.input_ids.reshape(-1, 4)[:, 0])


def test_order_resumes_and_does_not_depend_on_the_number_of_processes(tmp_path):
    f = token_file(tmp_path, lengths=(40, 41))  # 81 tokens: 20 rows of 4 (+1 label)
    one = TokenLoader(f, 4, Shard(micro=4, accum=1), seed=3, pack=True)
    steps = [rows_of(one.next_step()) for _ in range(7)]  # crosses an epoch (20 rows)
    assert steps[0] != steps[5]
    two = [TokenLoader(f, 4, Shard(micro=1, accum=2, rank=r, world=2), seed=3, pack=True) for r in (0, 1)]
    for want in steps[:3]:
        assert sorted(rows_of(two[0].next_step()) + rows_of(two[1].next_step())) == want
    again = TokenLoader(f, 4, Shard(micro=4, accum=1), seed=3, pack=True)
    again.load_state_dict(json.loads(json.dumps(two[0].state_dict())))
    assert [rows_of(again.next_step()) for _ in range(4)] == steps[3:]


def test_eval_batches_are_fixed_and_even_across_processes(tmp_path):
    f = token_file(tmp_path, lengths=(40, 41))
    shards = [Shard(micro=2, accum=1, rank=r, world=2) for r in (0, 1)]
    evals = [TokenLoader(f, 4, s, 0, True).eval_batches(7) for s in shards]
    assert [len(e) for e in evals] == [2, 2]  # 7 rows round up to 8
    assert sorted(rows_of(evals[0]) + rows_of(evals[1])) == [4 * i for i in range(8)]


class Counting:
    """A task source of the documented interface: batch(step, batch_size, seed) -> (ids, labels)."""

    def batch(self, step: int, batch_size: int, seed: int):
        ids = torch.arange(batch_size * 3).reshape(batch_size, 3) + 1000 * step + seed
        labels = torch.full_like(ids, IGNORE)
        labels[:, -1] = ids[:, 0]
        return ids, labels


def test_task_loader_splits_a_step_across_processes_and_resumes():
    whole = TaskLoader(Counting(), Shard(micro=4, accum=1), seed=7)
    parts = [TaskLoader(Counting(), Shard(micro=1, accum=2, rank=r, world=2), seed=7) for r in (0, 1)]
    for _ in range(2):
        want = whole.next_step()[0].input_ids
        got = torch.cat([b.input_ids for p in parts for b in p.next_step()])
        assert sorted(got[:, 0].tolist()) == sorted(want[:, 0].tolist())
    resumed = TaskLoader(Counting(), Shard(micro=4, accum=1), seed=7)
    resumed.load_state_dict(whole.state_dict())
    assert torch.equal(resumed.next_step()[0].input_ids, whole.next_step()[0].input_ids)
    assert whole.eval_batches(4)[0].input_ids[0, 0] >= 2**40  # held-out steps no training step reaches
