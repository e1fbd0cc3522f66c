"""Op-level functions, one per mixer core, with the peer's tensor conventions (see README.md).

Each op lives in its own folder (`naive.py` recurrent truth, a chunked PyTorch form, Triton
kernels) and is imported lazily so that `import lt2dsl.kernels` stays cheap.
"""

from importlib import import_module

_OPS = {
    "gated_delta_rule": "lt2dsl.kernels.gated_delta_rule",
    "delta_rule": "lt2dsl.kernels.delta_rule",
    "kda": "lt2dsl.kernels.kda",
    "gla": "lt2dsl.kernels.gla",
    "simple_gla": "lt2dsl.kernels.simple_gla",
    "mlstm": "lt2dsl.kernels.mlstm",
    "toeplitz_mix": "lt2dsl.kernels.toeplitz",
    "attention": "lt2dsl.kernels.attention",
    "dsa": "lt2dsl.kernels.dsa",
    "nsa": "lt2dsl.kernels.nsa",
}

__all__ = sorted(_OPS)


def __getattr__(name: str):
    if name not in _OPS:
        raise AttributeError(f"module 'lt2dsl.kernels' has no attribute {name!r}")
    return getattr(import_module(_OPS[name]), name)
