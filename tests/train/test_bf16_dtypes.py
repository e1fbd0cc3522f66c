"""bf16 over fp32 master weights: the Triton kernels see bf16 activations.

The forward runs on bf16 copies of the weights (`train/precision.py`); an fp32 tensor that
reached a kernel (an fp32 weight promoting a bf16 input on the way) would run the kernel's dots in
fp32 and keep twice the bytes for backward, silently. One training step of the tests' GDN + DSA
model with the Triton backend (interpreted on the CPU) records the dtype of every q, k, v a kernel
op receives, forward and backward.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lt2dsl.train import run

from .helpers import config

# op -> how many leading tensor arguments are activations (q, k, v)
QKV_OPS = {"delta_chunk_fwd": 3, "delta_chunk_bwd": 3, "dsa_attn_fwd": 3, "dsa_attn_bwd": 3}


class KernelDtypes(TorchDispatchMode):
    """Records {op name: set of dtype tuples of its q, k, v} for the ops of `QKV_OPS`."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, set[tuple[torch.dtype, ...]]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ns, _, name = func.name().partition("::")
        if ns == "lt2dsl" and name.split(".")[0] in QKV_OPS:
            n = QKV_OPS[name.split(".")[0]]
            dts = tuple(a.dtype for a in args[:n])
            self.seen.setdefault(name.split(".")[0], set()).add(dts)
        return func(*args, **(kwargs or {}))


def test_kernels_see_bf16_activations_over_fp32_master_weights(tmp_path):
    cfg = config(
        tmp_path,
        model={"backend": "triton"},
        data={"seq_len": 16},
        training={"steps": 1, "batch_size": 1, "precision": "bf16", "device": "cpu"},
        metrics={"log_interval": 1, "eval_rows": 1, "progress": False, "plot": False},
    )
    with KernelDtypes() as mode:
        result = run(cfg)
    assert next(result.model.parameters()).dtype == torch.float32  # the master weights
    assert set(mode.seen) >= set(QKV_OPS), mode.seen
    for op, dtypes in mode.seen.items():
        assert dtypes == {(torch.bfloat16,) * QKV_OPS[op]}, (op, dtypes)
