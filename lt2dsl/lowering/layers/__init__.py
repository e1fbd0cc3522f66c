"""The layer registry of the lowering: layer kind → mixer module class.

Each `LayerSpec.module` names its class as `"package.module:Class"`; the import happens here, on
first use, so the IR registry never imports torch and a kind whose layer is missing fails only
when a model that uses it is lowered.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from lt2dsl.ir.nodes import Mixer, ModelConfig
from lt2dsl.ir.registry import lookup

if TYPE_CHECKING:
    from lt2dsl.lowering.layers.base import MixerLayer


def layer_class(kind: str) -> type[MixerLayer]:
    """The `MixerLayer` subclass that lowers `kind` (an alias is accepted).

    Raises NotImplementedError when the spec's module does not exist yet, KeyError for an
    unknown kind.
    """
    spec = lookup(kind)
    if spec is None:
        raise KeyError(f"unknown layer kind `{kind}`")
    path, _, name = spec.module.partition(":")
    try:
        module = import_module(path)
    except ModuleNotFoundError as e:
        # Only the layer's own module missing means "not lowered yet"; a missing dependency
        # inside it is a real error and propagates.
        if e.name != path:
            raise
        raise NotImplementedError(f"layer kind `{spec.kind}` has no lowering yet ({spec.module})") from None
    return getattr(module, name)


def build_mixer(mixer: Mixer, cfg: ModelConfig, backend: str) -> MixerLayer:
    """Instantiate the layer of one resolved `Mixer` node with its options."""
    return layer_class(mixer.type)(mixer.opts, cfg, backend)
