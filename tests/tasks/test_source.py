"""`lt2dsl.tasks.build`: the trainer's interface (TOML tables in, LongTensor batches out)."""

from __future__ import annotations

import pytest
import torch

from lt2dsl.tasks import TASKS, build, parse_config
from lt2dsl.tasks.base import SEED_SPAN, seed_entropy

TABLES = [
    {"task": "state_tracking", "group": "s3", "length": 24},
    {"task": "mqar", "vocab": 128, "length": 64, "num_kv_pairs": 4},
    {"task": "copy", "length": 12},
    {"task": "selective_copy", "context": 30, "num_tokens": 5},
    {"task": "niah", "context": 512, "num_needles": 3},
]


def test_every_task_is_registered_and_tested():
    assert sorted(TASKS) == sorted(t["task"] for t in TABLES)


@pytest.mark.parametrize("table", TABLES, ids=[t["task"] for t in TABLES])
def test_batches_are_long_tensors_deterministic_in_seed_and_step(table):
    src = build(table)
    ids, labels = src.batch(step=3, batch_size=5, seed=11)
    assert ids.dtype == labels.dtype == torch.long and ids.shape == labels.shape == (5, src.seq_len)
    assert int(ids.max()) < src.vocab_size and int(labels.max()) < src.vocab_size
    assert (labels != -100).any() and ((labels == -100) | (labels >= 0)).all()
    again = build(dict(table)).batch(step=3, batch_size=5, seed=11)
    assert torch.equal(ids, again[0]) and torch.equal(labels, again[1])
    for other in (src.batch(4, 5, 11), src.batch(3, 5, 12), src.batch(3, 5, 11, split="test")):
        assert not torch.equal(ids, other[0])


def test_train_and_test_seeds_are_disjoint():
    assert seed_entropy(5, 0, "train") == [5, 0] and seed_entropy(5, 0, "test") == [SEED_SPAN + 5, 0]
    for bad in (-1, SEED_SPAN, 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            seed_entropy(bad, 0)
    with pytest.raises(ValueError, match="split"):
        seed_entropy(0, 0, "valid")


def test_bad_tables_name_the_problem():
    with pytest.raises(ValueError, match="`task` must be one of"):
        parse_config({"task": "mqqar"})
    with pytest.raises(ValueError, match="num_kv_pair: unknown key"):
        parse_config({"task": "mqar", "num_kv_pair": 4})
    with pytest.raises(ValueError, match="group"):
        parse_config({"task": "state_tracking", "group": "s4"})
    with pytest.raises(ValueError, match="max_stage"):
        parse_config({"task": "state_tracking", "stage": 5, "max_stage": 3})
    with pytest.raises(ValueError, match=r"bad `mqar` task config: vocab=8 leaves 3 keys for 8 pairs$"):
        parse_config({"task": "mqar", "vocab": 8, "num_kv_pairs": 8})
    with pytest.raises(TypeError, match="dict"):
        parse_config("mqar")


def test_observe_takes_counts_and_checks_them():
    src = build({"task": "state_tracking", "group": "parity", "max_stage": 2, "window": 1})
    fixed = build({"task": "mqar", "num_kv_pairs": 4, "length": 32, "vocab": 64})
    assert src.observes and not fixed.observes
    assert fixed.observe(0, 1, 4) == 0.25 and fixed.observe(1, 0, 0) == 1.0  # no curriculum: no-op
    assert src.observe(0, 3, 4) == 0.75 and src.curriculum.stage == 1
    for bad in ((5, 4), (-1, 4), (1.0, 4), (True, 4)):
        with pytest.raises(ValueError, match=r"right|answers"):
            src.observe(1, *bad)
    assert src.observe(1, 4, 4) == 1.0 and src.curriculum.stage == 2
