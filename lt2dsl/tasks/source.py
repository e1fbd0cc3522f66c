"""`TaskSource`: what a trainer draws batches from (`lt2dsl.tasks.build(cfg)` returns one).

    source = build({"task": "mqar", "num_kv_pairs": 8})
    ids, labels = source.batch(step, batch_size, seed)   # LongTensor [B, T] each, -100: no loss

A batch is a pure function of `(seed, step, split)` and, for a curriculum task, of the stage, so
resuming a run needs only the step and `state_dict()`. A curriculum advances only when the trainer
reports accuracy: `observe(step, logits, labels)` after each training step (a no-op for tasks
without a curriculum, so a trainer may always call it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lt2dsl.tasks.base import IGNORE, TaskConfig, TaskData, check_batch_size, seed_entropy

if TYPE_CHECKING:
    import torch


class TaskSource:
    """Batches of one task config (see the module docstring).

    Attributes:
        cfg: the task config.
        vocab_size: ids of inputs and labels lie in `[0, vocab_size)`.
        seq_len: the longest row (a curriculum's last stage).
        curriculum: the length curriculum, or None.
    """

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg
        self.vocab_size, self.seq_len = cfg.vocab_size, cfg.seq_len
        self.curriculum = cfg.curriculum()

    def current(self) -> TaskConfig:
        """The config batches come from now (the curriculum's stage, if any)."""
        if self.curriculum is None:
            return self.cfg
        return self.cfg.at_stage(self.curriculum.stage)

    def sample(self, step: int, batch_size: int, seed: int = 0, split: str = "train") -> TaskData:
        """Batch `step` as numpy arrays with its slices (what evaluation reads)."""
        check_batch_size(batch_size)
        return self.current().generate(batch_size, seed_entropy(seed, step, split))

    def batch(
        self, step: int, batch_size: int, seed: int = 0, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, labels): LongTensors `[B, T]` on the CPU, labels -100 where no loss."""
        import torch

        data = self.sample(step, batch_size, seed, split)
        return torch.from_numpy(data.inputs), torch.from_numpy(data.labels)

    def observe(self, step: int, logits: torch.Tensor, labels: torch.Tensor) -> float:
        """Report a training batch's exact-match accuracy to the curriculum; returns it.

        Args:
            step: the step the batch came from.
            logits: `[B, T, V]` (argmax over V is the prediction).
            labels: `[B, T]`, -100 where no answer.
        """
        acc = exact_match(logits, labels)
        if self.curriculum is not None:
            self.curriculum.update(step, acc)
        return acc

    def state_dict(self) -> dict:
        """What a checkpoint saves to resume this source exactly (the curriculum's state)."""
        return {} if self.curriculum is None else {"curriculum": self.curriculum.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.curriculum is not None and "curriculum" in state:
            self.curriculum.load_state_dict(state["curriculum"])


def exact_match(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of answers (labels != -100) whose argmax prediction equals the label (1.0 with none)."""
    import torch

    with torch.no_grad():
        mask = labels != IGNORE
        n = int(mask.sum())
        if n == 0:
            return 1.0
        hits = (logits.argmax(-1) == labels.to(logits.device)) & mask.to(logits.device)
        return float(hits.sum()) / n
