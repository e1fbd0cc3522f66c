"""Batches: rows of a token file in a seeded order, or a task's batches; both resumable.

A global step takes `batch_size` rows (all processes, all micro-batches); process `rank` of
`world` runs micro-batch m on rows `[(m·world + rank)·micro, … + micro)` of them, so the rows of a
step and therefore the run do not depend on the number of processes. A loader's position is
its `state_dict()`: loading it continues at the same token.

Token files: row i holds tokens `[i·T, i·T + T + 1)` (inputs and next-token labels), rows are
visited in a permutation drawn from (seed, epoch). With `pack_documents`, a micro-batch of R rows
becomes one packed row `[1, R·T]` with int32 `cu_seqlens` at every document start and row start,
and a document's last token gets label -100 (the next token belongs to another document). A
micro-batch none of whose rows holds a document start past its first token (documents of at least
a row, as in long-context training) stays `[R, T]` without `cu_seqlens`: the same sequences, and
the kernels' fixed-length forms (the attention backward's dQ from dS among them) apply.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from lt2dsl.train.data import TokenFile

IGNORE = -100


@dataclass
class Batch:
    """One micro-batch: `input_ids` and `labels` `[B, T]` (`[1, R·T]` when packed), int64;
    `cu_seqlens` `[N + 1]` int32 for a packed row, else None (each row one sequence)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    cu_seqlens: torch.Tensor | None = None

    def to(self, device: torch.device) -> Batch:
        def move(t):
            if t is None or device.type == "cpu":
                return t
            return t.pin_memory().to(device, non_blocking=True)

        return Batch(move(self.input_ids), move(self.labels), move(self.cu_seqlens))


@dataclass(frozen=True)
class Shard:
    """Which rows of a global step this process runs: `micro` rows per micro-batch, `accum`
    micro-batches, at `rank` of `world`."""

    micro: int
    accum: int
    rank: int = 0
    world: int = 1

    def rows(self, step_rows: np.ndarray, m: int) -> np.ndarray:
        first = (m * self.world + self.rank) * self.micro
        return step_rows[first : first + self.micro]

    @property
    def global_rows(self) -> int:
        return self.micro * self.accum * self.world


class TokenLoader:
    """Rows of a `TokenFile` in a per-epoch permutation (see the module docstring)."""

    def __init__(self, file: TokenFile, seq_len: int, shard: Shard, seed: int, pack: bool):
        self.file, self.T, self.shard, self.seed, self.pack = file, seq_len, shard, seed, pack
        self.n_rows = (file.n_tokens - 1) // seq_len
        if self.n_rows < 1:
            raise ValueError(
                f"data.seq_len={seq_len} is longer than the data ({file.n_tokens} tokens in {file.path.name})"
            )
        self.epoch, self.offset = 0, 0
        self._perm: tuple[int, np.ndarray] | None = None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])

    def next_step(self) -> list[Batch]:
        """The micro-batches of the next global step, for this process."""
        rows = self._take(self.shard.global_rows)
        return [self.batch(self.shard.rows(rows, m)) for m in range(self.shard.accum)]

    def eval_batches(self, n_rows: int) -> list[Batch]:
        """This process's share of the first `n_rows` rows (rounded up to whole micro-batches on
        every process, so all run the same number of forwards; rows repeat when the split is
        shorter), in order: the same set every time."""
        per = self.shard.micro * self.shard.world
        rows = np.arange(-(-n_rows // per) * per) % self.n_rows
        mine = rows[self.shard.rank :: self.shard.world]
        return [self.batch(mine[i : i + self.shard.micro]) for i in range(0, len(mine), self.shard.micro)]

    def _take(self, k: int) -> np.ndarray:
        out = []
        while k > 0:
            perm = self._permutation()
            got = perm[self.offset : self.offset + k]
            out.append(got)
            k -= len(got)
            self.offset += len(got)
            if self.offset == self.n_rows:
                self.epoch, self.offset = self.epoch + 1, 0
        return np.concatenate(out)

    def _permutation(self) -> np.ndarray:
        if self._perm is None or self._perm[0] != self.epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, self.epoch]))
            self._perm = (self.epoch, rng.permutation(self.n_rows))
        return self._perm[1]

    def batch(self, rows: np.ndarray) -> Batch:
        T = self.T
        tokens = self.file.view()
        x = np.stack([np.asarray(tokens[r * T : r * T + T + 1], dtype=np.int64) for r in rows])
        inputs, labels = x[:, :-1], x[:, 1:].copy()
        if not self.pack:
            return Batch(torch.from_numpy(np.ascontiguousarray(inputs)), torch.from_numpy(labels))
        cu = [0]
        for i, r in enumerate(rows):
            lo, hi = np.searchsorted(self.file.starts, [r * T + 1, r * T + T], side="left")
            inside = self.file.starts[lo:hi] - r * T  # document starts strictly inside the row
            labels[i, inside - 1] = IGNORE
            if hi < len(self.file.starts) and self.file.starts[hi] == r * T + T:
                labels[i, T - 1] = IGNORE  # the token after the row starts a document
            cu += [i * T + int(s) for s in inside] + [(i + 1) * T]
        if len(cu) == len(rows) + 1:  # no document starts inside a row: each row is one sequence
            return Batch(torch.from_numpy(np.ascontiguousarray(inputs)), torch.from_numpy(labels))
        return Batch(
            torch.from_numpy(np.ascontiguousarray(inputs)).reshape(1, -1),
            torch.from_numpy(labels).reshape(1, -1),
            torch.tensor(cu, dtype=torch.int32),
        )


class TaskLoader:
    """Batches of a task source (`source.batch(step, batch_size, seed) -> (ids, labels)`).

    A source whose `observes` is true (a curriculum) is told after each training step how many
    of the step's labelled tokens the model predicted right: `source.observe(batch, right,
    answers)`, `batch` being the index of the step's batch; its `state_dict()` goes into the
    checkpoints with the loader's position.
    """

    def __init__(self, source, shard: Shard, seed: int):
        self.source, self.shard, self.seed = source, shard, seed
        self.step = 0
        self.observes = bool(getattr(source, "observes", False))
        self.accuracy: float | None = None

    def observe(self, right: int, answers: int) -> None:
        """Report the last training batch's exact match (all processes' counts) to the source."""
        self.accuracy = self.source.observe(self.step - 1, right, answers)

    def metrics(self) -> dict[str, float]:
        """`task/accuracy` of the last observed batch, and `task/stage` for a curriculum."""
        out = {} if self.accuracy is None else {"task/accuracy": self.accuracy}
        stage = getattr(getattr(self.source, "curriculum", None), "stage", None)
        if stage is not None:
            out["task/stage"] = stage
        return out

    def state_dict(self) -> dict:
        state = {"step": self.step}
        if hasattr(self.source, "state_dict"):
            state["source"] = self.source.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        if "source" in state and hasattr(self.source, "load_state_dict"):
            self.source.load_state_dict(state["source"])

    def next_step(self) -> list[Batch]:
        ids, labels = self._draw(self.step, "train")
        self.step += 1
        rows = np.arange(ids.shape[0])
        return [self._slice(ids, labels, self.shard.rows(rows, m)) for m in range(self.shard.accum)]

    def eval_batches(self, n_rows: int) -> list[Batch]:
        """Held-out batches: the source's test split where it has one, else steps no training
        step reaches (the sources are pure functions of (seed, step))."""
        out, per = [], self.shard.global_rows
        for i in range(max(1, -(-n_rows // per))):
            ids, labels = self._draw(i, "test")
            rows = np.arange(ids.shape[0])[self.shard.rank :: self.shard.world]
            out += [
                self._slice(ids, labels, rows[j : j + self.shard.micro])
                for j in range(0, len(rows), self.shard.micro)
            ]
        return out

    def _draw(self, step: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.shard.global_rows
        if split == "train":
            return _check_task_batch(self.source.batch(step, n, self.seed), n)
        if "split" in inspect.signature(self.source.batch).parameters:
            return _check_task_batch(self.source.batch(step, n, self.seed, split="test"), n)
        return _check_task_batch(self.source.batch(2**40 + step, n, self.seed), n)

    @staticmethod
    def _slice(ids: torch.Tensor, labels: torch.Tensor, rows: np.ndarray) -> Batch:
        index = torch.from_numpy(rows)
        return Batch(ids[index].long().contiguous(), labels[index].long().contiguous())


def _check_task_batch(out, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise ValueError("a task source's batch() must return (input_ids, labels) tensors [B, T]")
    ids, labels = out
    if ids.dim() != 2 or ids.shape != labels.shape or ids.shape[0] != n:
        raise ValueError(
            f"a task source's batch() returned input_ids {list(ids.shape)} and labels "
            f"{list(labels.shape)}; expected both [{n}, T]"
        )
    return ids, labels
