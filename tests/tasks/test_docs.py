"""docs/tasks.md stays true: its example rows, its task table's names and keys."""

from __future__ import annotations

import re
from pathlib import Path

from lt2dsl.tasks import TASKS, show
from lt2dsl.tasks.state_tracking import state_tracking

DOC = (Path(__file__).parents[2] / "docs" / "tasks.md").read_text(encoding="utf-8")


def test_the_parity_example_is_the_generators():
    rows = show(state_tracking(batch_size=1, seed=0, group="parity", length=12))
    assert f"```\n{rows}\n```" in DOC


def test_the_task_table_names_every_task_and_only_real_keys():
    table = [line for line in DOC.splitlines() if re.match(r"\| `[a-z_]+` \| ", line)]
    named = {re.match(r"\| `([a-z_]+)`", line).group(1): line for line in table}
    assert set(TASKS) <= set(named)
    for task, line in named.items():
        if task not in TASKS:
            continue
        keys_cell = line.split(" | ")[1]
        keys = set(re.findall(r"`([a-z_]+)` \(", keys_cell))
        assert keys and keys <= set(TASKS[task].model_fields) - {"task"}, (task, keys)
