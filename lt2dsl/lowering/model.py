"""`LT2Model`: the lowered model a researcher imports, trains and decodes with.

The module owns the parameters (`embed`, `blocks.<i>`, `loops.<k>`, `final_norm`, `lm_head`:
exactly `lt2dsl.cost.estimate.model_weights`) and runs `graph_module`, the traced
`torch.fx.GraphModule` that shares them. Inputs are checked here, outside the graph, since the
checks depend on tensor values.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from lt2dsl.ir import nodes as n
from lt2dsl.ir.constraints import require_model
from lt2dsl.lowering import packed
from lt2dsl.lowering.blocks import ExitMix, LoopExtras, ResidualBlock, make_norm
from lt2dsl.lowering.cache import Cache
from lt2dsl.lowering.norms import OffsetRMSNorm
from lt2dsl.lowering.to_fx import Unrolled, loops_preorder, to_fx
from lt2dsl.passes.resolve import blocks as iter_blocks

# Residual-branch output projections, scaled by 1/sqrt(2 · applications) at init (GPT-2).
OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "down_proj", "proj_down")
BACKENDS = ("reference", "triton", "auto")
# The index dtypes `nn.Embedding` takes.
ID_DTYPES = (torch.int64, torch.int32)


class LT2Model(nn.Module):
    """A lowered `.lt2` model.

    Args:
        model (n.Model): the resolved program.
        backend (str, Optional): kernel backend of every mixer: "reference", "triton" or "auto".
            Default: "auto".

    `forward(input_ids [B, T], cache=None, cu_seqlens=None) -> logits [B, T, vocab]` (hidden
    states `[B, T, D]` for `head = none`). With a cache (`new_cache(B)`) the call continues the
    cached sequences: a prefill of any length, then decode steps; the cache is updated in place.
    With `cu_seqlens` (int32 `[N + 1]`, fla's convention) `input_ids [1, T]` is a packed row of
    N documents, each run as its own sequence (`lt2dsl/lowering/packed.py`).
    """

    def __init__(self, model: n.Model, backend: str = "auto"):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        require_model(model)  # the validator's limits, asserted for a Model built in Python
        cfg = model.config
        self.ir, self.config, self.backend = model, cfg, backend
        self.graph_passes: list[Callable[[torch.fx.GraphModule], torch.fx.GraphModule]] = []
        placed = iter_blocks(model.body)
        self.applications = sum(it for _, it in placed)
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(ResidualBlock(b, cfg, backend) for b, _ in placed)
        self.loops = nn.ModuleList(LoopExtras(lp, cfg.dim) for lp in loops_preorder(model.body))
        self.final_norm = make_norm(cfg.norm, cfg.dim)
        if cfg.head and not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        caps = [m.opts["max_len"] for b, _ in placed for m in b.mixers if m.type == "tmm"]
        self.max_len: int | None = min(caps) if caps else None
        self.reset_parameters()

    # ---- graph ----------------------------------------------------------------------------------

    @property
    def graph_module(self) -> torch.fx.GraphModule:
        """The traced `torch.fx.GraphModule` that `forward` runs (shares this module's parameters).

        Traced on first use and again after `.to()` / `.cuda()` (which may replace buffers the
        graph refers to), then rewritten by `graph_passes`. Kept out of `_modules`, so parameters
        are registered (and counted) once, under their estimate names.
        """
        gm = self.__dict__.get("_graph_module")
        if gm is None:
            root = Unrolled(
                self.ir, self.embed, self.blocks, self.loops, self.final_norm, getattr(self, "lm_head", None)
            )
            gm = to_fx(root)
            for graph_pass in self.graph_passes:
                gm = graph_pass(gm)
            self.__dict__["_graph_module"] = gm
        return gm

    def build_graph(self) -> torch.fx.GraphModule:
        """Trace and run `graph_passes` now unless done (what the first use would do); the graph."""
        return self.graph_module

    def rebuild_graph(self) -> None:
        """Trace again on next use, then apply `graph_passes` (GraphModule → GraphModule, in order:
        e.g. a fusion pass) — call after changing `graph_passes`."""
        self.__dict__["_graph_module"] = None

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.rebuild_graph()
        return out

    def __getstate__(self) -> dict:
        """Pickle (`torch.save(model)`, `copy.deepcopy`) without the traced graph: it is derived
        from the parameters and traced again on first use (a GraphModule does not pickle)."""
        return {**self.__dict__, "_graph_module": None}

    # ---- init -----------------------------------------------------------------------------------

    def reset_parameters(self) -> None:
        """Projections and embeddings normal(0, 0.02), biases 0, norms 1; then each mixer's own
        `reset_parameters` (A_log, dt_bias, decays, conv taps, ... per mixers.md); then output
        projections of residual branches scaled by 1/sqrt(2 · block applications) (GPT-2)."""
        if self.embed.weight.device.type == "meta":
            return  # nothing to initialise (and meta random fills are slow to set up)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Linear | nn.Embedding):
                    nn.init.normal_(m.weight, 0.0, 0.02)
                    if getattr(m, "bias", None) is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.RMSNorm | nn.LayerNorm | OffsetRMSNorm):
                    m.reset_parameters()
            for block in self.blocks:
                for mixer in block.mixers:
                    if hasattr(mixer, "reset_parameters"):
                        mixer.reset_parameters()
            scale = 1.0 / math.sqrt(2 * max(1, self.applications))
            for name, p in self.blocks.named_parameters():
                if name.endswith(".weight") and name.split(".")[-2] in OUTPUT_PROJECTIONS:
                    p.mul_(scale)

    # ---- running --------------------------------------------------------------------------------

    def new_cache(self, batch_size: int, max_len: int | None = None) -> Cache:
        """An empty decode cache for `batch_size` sequences: one entry per (iteration, block).

        With `max_len`, KV caches are allocated for that many tokens at their first use and decode
        steps write into them in place (no copy of the cache per token); a longer run still works,
        each step past it then reallocating. Without it they hold exactly the tokens seen.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
            raise ValueError(f"max_len must be a positive integer or None, got {max_len!r}")
        return Cache(self.applications, batch_size, max_len)

    def forward(
        self, input_ids: torch.Tensor, cache: Cache | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids `[B, T]` (integer token ids) → logits `[B, T, vocab]`; `cu_seqlens` `[N + 1]`
        marks the document starts of a packed row (B = 1, no cache)."""
        self.check_input(input_ids, cache, cu_seqlens)
        return self.graph_module(input_ids, cache, cu_seqlens)

    def check_input(self, input_ids, cache: Cache | None, cu_seqlens: torch.Tensor | None = None) -> None:
        """Raise ValueError naming what was expected for a bad `input_ids`, `cache` or `cu_seqlens`."""
        cfg = self.config
        if not isinstance(input_ids, torch.Tensor):
            raise ValueError(
                f"input_ids must be a torch.Tensor of token ids [B, T], got {type(input_ids).__name__}"
            )
        if input_ids.dtype not in ID_DTYPES:
            raise ValueError(
                f"input_ids must have an integer dtype (torch.long or torch.int32, what the embedding "
                f"takes), got {input_ids.dtype}; convert with `.long()`"
            )
        if input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise ValueError(f"input_ids must have shape [B, T] with T >= 1, got {list(input_ids.shape)}")
        device = self.embed.weight.device
        if input_ids.device != device:
            raise ValueError(f"input_ids must be on the model's device {device}, got {input_ids.device}")
        if input_ids.device.type != "meta":
            bad = (input_ids < 0) | (input_ids >= cfg.vocab)
            if torch.compiler.is_compiling():
                # a branch on a tensor's value would break the compiled graph: assert inside it
                msg = f"token ids must be in [0, {cfg.vocab}) (vocab = {cfg.vocab})"
                torch._assert_async(~bad.any(), msg)
            elif bool(bad.any()):
                lo, hi = int(input_ids.min()), int(input_ids.max())
                raise ValueError(
                    f"token ids must be in [0, {cfg.vocab}) (vocab = {cfg.vocab}), got values in [{lo}, {hi}]"
                )
        packed.check_cu_seqlens(cu_seqlens, input_ids, cache is not None)
        self._check_cache(input_ids, cache, cu_seqlens)

    def _check_cache(self, input_ids: torch.Tensor, cache: Cache | None, cu_seqlens=None) -> None:
        B, T = input_ids.shape
        if cu_seqlens is not None and self.max_len is not None and input_ids.device.type != "meta":
            T = max(packed.split(cu_seqlens))  # the longest document is the longest sequence
        seen = 0
        if cache is not None:
            if not isinstance(cache, Cache) or len(cache.entries) != self.applications:
                raise ValueError(
                    f"cache must come from this model's new_cache() ({self.applications} "
                    f"entries), got {cache!r}"
                )
            if cache.batch_size != B:
                raise ValueError(
                    f"input_ids has batch size {B} but the cache was made for batch_size={cache.batch_size}"
                )
            seen = cache.seen
        if self.max_len is not None and seen + T > self.max_len:
            raise ValueError(
                f"the sequence would reach {seen + T} tokens but tmm's max_len={self.max_len} "
                f"(the Toeplitz kernel length) is the longest it can mix"
            )

    @property
    def exit_probs(self) -> torch.Tensor | list[torch.Tensor] | None:
        """p `[B, L, T]` of the last call for a model with one `exit=gate` loop (a list with
        several, in loop order; None without gated loops or before the first call)."""
        ps = [m.last_p for m in self.modules() if isinstance(m, ExitMix)]
        if not ps:
            return None
        return ps[0] if len(ps) == 1 else ps

    def generate(
        self,
        input_ids,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        *,
        top_p: float | None = None,
        stop_tokens: int | list[int] | None = None,
        pad_token_id: int | None = None,
        seed: int | None = None,
    ):
        """Continue prompts by up to `max_new_tokens` tokens, in eval mode (`lt2dsl.engine`).

        Args:
            input_ids: `[B, T]` token ids → `[B, T + n]`; or a list of prompts of any lengths (1-D
                tensors or lists of ids) → a list of 1-D tensors. A batch gives each prompt the
                tokens it would get alone.
            max_new_tokens (int): tokens to add per prompt (fewer once every row met a stop token).
            temperature (float, Optional): 0 is greedy (argmax); else sampling from
                softmax(logits / temperature). Default: `0.0`.
            top_k (int, Optional): sample among the k most likely tokens. Default: `None`.
            generator (torch.Generator, Optional): seeds the sampling (one draw per call). Default: `None`.
            top_p (float, Optional): sample within the top-p nucleus, p in (0, 1]. Default: `None`.
            stop_tokens (int or list, Optional): a row ends at the first of these it emits. Default: `None`.
            pad_token_id (int, Optional): what a finished row emits. Default: the first stop token.
            seed (int, Optional): the sampling seed, instead of a generator. Default: `None`.

        The engine (`lt2dsl.engine.Engine`) decodes through static caches, on CUDA with each step
        captured as a CUDA graph; `lt2dsl.engine.stream` yields the new tokens step by step.
        """
        from lt2dsl.engine import engine_for

        return engine_for(self).generate(
            input_ids,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=generator,
            stop_tokens=stop_tokens,
            pad_token_id=pad_token_id,
            seed=seed,
        )
