"""Op-level functions, one per mixer core, with the peer's tensor conventions (see README.md).

Each op family lives in its own folder (`naive.py` recurrent truth, a chunked PyTorch form, Triton
kernels). The functions are bound here eagerly: a lazy module `__getattr__` would be shadowed by
the op's subpackage of the same name as soon as anything imported that subpackage.
"""

from lt2dsl.env import triton_interpreting
from lt2dsl.kernels.common.backend import keep_autotune_results
from lt2dsl.kernels.common.interpreter import skip_nested_patching

# before the op modules below make their autotuners (they read the switch when made)
keep_autotune_results()
if triton_interpreting():
    skip_nested_patching()

from lt2dsl.kernels.attention import attention  # noqa: E402
from lt2dsl.kernels.delta import delta_rule, gated_delta_rule, kda  # noqa: E402
from lt2dsl.kernels.dsa import dsa  # noqa: E402
from lt2dsl.kernels.gla import gla  # noqa: E402
from lt2dsl.kernels.mlstm import mlstm  # noqa: E402
from lt2dsl.kernels.nsa import nsa  # noqa: E402
from lt2dsl.kernels.simple_gla import simple_gla  # noqa: E402
from lt2dsl.kernels.toeplitz import toeplitz_mix, toeplitz_mix_step  # noqa: E402

__all__ = [
    "attention",
    "delta_rule",
    "dsa",
    "gated_delta_rule",
    "gla",
    "kda",
    "mlstm",
    "nsa",
    "simple_gla",
    "toeplitz_mix",
    "toeplitz_mix_step",
]
