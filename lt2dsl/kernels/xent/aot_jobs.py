"""sm_90 compile jobs of the cross-entropy kernel (`common.aot`): bf16 and fp32 logits of a 32k
vocabulary (the examples'), with and without the gradient, at the launch code's fixed config."""

from __future__ import annotations

from lt2dsl.kernels.common.aot import Job
from lt2dsl.kernels.xent import triton_xent as X

VOCAB = 32000


def jobs() -> list[Job]:
    cfg = X._cfg(VOCAB)
    out = []
    for dt in ("bf16", "fp32"):
        for grads in (True, False):
            types = {"X": f"*{dt}", "Y": "*i64", "LOSS": "*fp32", "G": f"*{dt}"}
            types |= {"V": "i32", "stride_x": "i32", "stride_g": "i32"}
            cex = {"IGNORE_ID": X.IGNORE, "BV": cfg["BV"], "GRADS": grads}
            out.append(Job(f"xent/xent-{dt}-g{grads:d}", X._xent_kernel, types, cex, cfg["num_warps"], 1,
                           aligned=frozenset({"V", "stride_x", "stride_g"})))  # fmt: skip
    return out
