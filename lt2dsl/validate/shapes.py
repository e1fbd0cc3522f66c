"""Shapes (E05xx, W05xx): head counts, head dims and widths that must fit together.

These rules read the resolved model (every default filled in), so they run only when the surface
rules found no error; each problem points at the value the user wrote, else at the model setting
the value came from, else at the call.
"""

from __future__ import annotations

from collections.abc import Iterator

from lt2dsl.diagnostics import Diagnostic, error, warning
from lt2dsl.ir import nodes as n
from lt2dsl.ir.constraints import BY_CODE, divisors, kv_problem
from lt2dsl.ir.printer import size
from lt2dsl.validate.context import Ctx, ShapeCtx
from lt2dsl.validate.rules import rule

# Kinds whose heads / head_dim / kv_heads default to the model settings of the same name.
INHERITS = ("heads", "head_dim", "kv_heads")


def constraint_errors(s: ShapeCtx, code: str, skip=lambda m: False) -> Iterator[Diagnostic]:
    """The diagnostics of constraint `code` (lt2dsl/ir/constraints.py, which the lowering
    asserts too), each at the option value the user wrote, else the setting it inherits."""
    c = BY_CODE[code]
    for m in s.mixers():
        if m.type not in c.kinds or skip(m):
            continue
        if (p := c.check(m.type, m.opts, s.cfg)) is not None:
            where = s.where(m, c.options(m.type), INHERITS if c.inherits else ())
            yield error(code, p.message, where, label=p.label, help=p.help)


@rule("E0501")
def check_kv_heads(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Query heads not a multiple of key/value heads.

    What it checks:
        For attention mixers (`full`, `swa`, `dsa`, `nsa`), `gla` and for the model's `heads` /
        `kv_heads` settings: `heads % kv_heads == 0`.

    Why it matters:
        Grouped-query attention shares each key/value head with a whole group of query heads;
        the groups must come out even.

    Example:
        dim = 1024
        full(heads=6, kv_heads=4)

    Use instead:
        dim = 1024
        full(heads=8, kv_heads=4)
    """
    cfg = s.cfg
    if "kv_heads" in s.settings and (p := kv_problem(cfg.heads, cfg.kv_heads)) is not None:
        yield error("E0501", p.message, s.setting_span("kv_heads"), label=p.label, help=p.help)

    def from_model(m: n.Mixer) -> bool:
        call = s.call_of(m)
        # both come from the model: reported once above
        return s.written(call, "heads") is None and s.written(call, "kv_heads") is None

    yield from constraint_errors(s, "E0501", skip=from_model)


@rule("E0502")
def check_value_heads(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Value heads not a multiple of query/key heads (GVA).

    What it checks:
        For `gdn` and `kda`: `v_heads % heads == 0`.

    Why it matters:
        With grouped value heads each query/key head serves a whole group of value heads, so the
        value heads must be a multiple of the query/key heads.

    Example:
        dim = 1024
        gdn(heads=4, v_heads=6)

    Use instead:
        dim = 1024
        gdn(heads=4, v_heads=8)
    """
    yield from constraint_errors(s, "E0502")


@rule("E0503")
def check_derived_head_dim(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Derived head dim not a whole number.

    What it checks:
        `head_dim · expand_v` (`gdn`, `kda`, `retnet`), `head_dim · expand_k` (`gla`) and
        `head_dim · qk_dim_factor` (`mlstm`) are whole numbers of at least 1.

    Why it matters:
        They are the widths of the key or value heads; a tensor cannot have 37.5 columns.

    Example:
        dim = 1024
        head_dim = 100
        gla(expand_k=0.375)

    Use instead:
        dim = 1024
        head_dim = 128
        gla(expand_k=0.375)
    """
    yield from constraint_errors(s, "E0503")


@rule("E0504")
def check_mamba2_width(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Mamba2 heads do not tile the inner width.

    What it checks:
        For `mamba2`: `heads · head_dim == expand · dim` (the SSM heads exactly cover the inner
        width d_in).

    Why it matters:
        Mamba2 splits its inner width into heads of `head_dim` channels; a remainder would be
        channels no head owns.

    Example:
        dim = 1024
        mamba2(head_dim=48)

    Use instead:
        dim = 1024
        mamba2(head_dim=64)
    """
    yield from constraint_errors(s, "E0504")


@rule("E0505")
def check_tmm_heads(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Toeplitz heads do not divide the model width.

    What it checks:
        For `tmm`: `dim % heads == 0`.

    Why it matters:
        `tmm` splits the channels into `heads` groups with their own Toeplitz kernels; the groups
        must be equal.

    Example:
        dim = 1024
        max_len = 4k
        tmm(heads=3)

    Use instead:
        dim = 1024
        max_len = 4k
        tmm(heads=4)
    """
    yield from constraint_errors(s, "E0505")


@rule("E0506")
def check_tmm_max_len(s: ShapeCtx) -> Iterator[Diagnostic]:
    """`tmm` without an explicit `max_len`.

    What it checks:
        A `tmm` block while neither the model (`max_len = ...`, `--set max_len=...`) nor the
        call (`tmm(max_len=...)`) says how long sequences get.

    Why it matters:
        The Toeplitz kernel has one weight per position: `max_len` fixes the parameter count and
        the longest sequence the model can ever read. A silent default would fix it by accident.

    Example:
        dim = 1024
        tmm

    Use instead:
        dim = 1024
        max_len = 8k
        tmm
    """
    if "max_len" in s.settings:
        return
    for m in s.mixers():
        call = s.call_of(m)
        if m.type != "tmm" or s.written(call, "max_len") is not None:
            continue
        # point at the `tmm` the user wrote (inside the `let`, for a binding used as is)
        span = kind_call(s.ctx, call).name_span if call is not None else m.span
        yield error(
            "E0506",
            "`tmm` needs a `max_len`",
            span,
            label="no `max_len` for this block",
            help="set `max_len = ...` on the model (or `--set max_len=...`), or write `tmm(max_len=...)`",
        )


def kind_call(ctx: Ctx, call: n.Call) -> n.Call:
    """The call in a `let` chain that names the layer kind itself."""
    node, seen = call, set()
    while node.name in ctx.lets and node.name not in seen and isinstance(ctx.lets[node.name].item, n.Call):
        seen.add(node.name)
        node = ctx.lets[node.name].item
    return node


@rule("E0507")
def check_nsa_stride(s: ShapeCtx) -> Iterator[Diagnostic]:
    """NSA compression stride does not divide the block sizes.

    What it checks:
        For `nsa`: `stride` divides `cmp_block` and `block`.

    Why it matters:
        Selection blocks are scored from the compressed blocks that overlap them; that mapping
        is exact only when both block sizes are multiples of the stride.

    Example:
        dim = 1024
        nsa(stride=24)

    Use instead:
        dim = 1024
        nsa(stride=16)
    """
    yield from constraint_errors(s, "E0507")


@rule("E0508")
def check_model_head_dim(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Model width not a multiple of the heads.

    What it checks:
        When the model does not set `head_dim`, `dim % heads == 0` (the default head dim is
        `dim / heads`).

    Why it matters:
        Otherwise the default head dim would be rounded down and the heads would not cover the
        model width.

    Example:
        dim = 1000
        heads = 16
        gdn

    Use instead:
        dim = 1000
        heads = 8
        gdn
    """
    cfg = s.cfg
    if "head_dim" in s.settings or cfg.dim % cfg.heads == 0:
        return
    default = "" if "heads" in s.settings else ", the default max(1, dim / 128)"
    yield error(
        "E0508",
        f"`dim` ({cfg.dim}) is not a multiple of `heads` ({cfg.heads}{default})",
        s.setting_span("heads", "dim"),
        label="the default head dim `dim / heads` is not a whole number",
        help=f"set `head_dim`, or choose `heads` dividing {cfg.dim}: {divisors(cfg.dim)}",
    )


@rule("W0501")
def check_window_fits(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Window longer than `max_len`.

    What it checks:
        For `swa` and `nsa`: `window <= max_len`.

    Why it matters:
        A window longer than any sequence never slides: every query sees every key, which is
        full attention with extra bookkeeping. The estimate and the kernels treat it so.

    Example:
        dim = 1024
        max_len = 4k
        swa(window=8k)

    Use instead:
        dim = 1024
        max_len = 4k
        full
    """
    for m in s.mixers():
        if m.type in ("swa", "nsa") and m.opts["window"] > s.cfg.max_len:
            w, L = size(m.opts["window"]), size(s.cfg.max_len)
            yield warning(
                "W0501",
                f"`{m.type}` window ({w}) is longer than `max_len` ({L})",
                s.where(m, ("window",)),
                label="every query sees every key",
                help="this is full attention: use `full`, or a window shorter than `max_len`",
            )


@rule("W0502")
def check_topk_fits(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Top-k not smaller than `max_len`.

    What it checks:
        For `dsa`: `topk < max_len`.

    Why it matters:
        When top-k is at least the sequence length the selection keeps every key: the block is
        full attention plus the cost of the lightning indexer.

    Example:
        dim = 1024
        max_len = 2k
        dsa(topk=2k)

    Use instead:
        dim = 1024
        max_len = 2k
        dsa(topk=256)
    """
    for m in s.mixers():
        if m.type == "dsa" and m.opts["topk"] >= s.cfg.max_len:
            k, L = size(m.opts["topk"]), size(s.cfg.max_len)
            yield warning(
                "W0502",
                f"`dsa` top-k ({k}) is not smaller than `max_len` ({L})",
                s.where(m, ("topk",)),
                label="selects every key",
                help="use `full`, or a top-k well below `max_len`",
            )


@rule("E0509")
def check_rope_head_dim(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Odd head dim on a mixer with rotary position embeddings.

    What it checks:
        For `full`, `swa`, `dsa`, `nsa` and `retnet`: `head_dim` is even.

    Why it matters:
        RoPE (and RetNet's xPos) rotates the query and key dims in pairs; an odd head dim
        leaves one dim without a partner, which the kernels cannot rotate.

    Example:
        dim = 64
        heads = 64
        full

    Use instead:
        dim = 64
        heads = 32
        full
    """
    yield from constraint_errors(s, "E0509")


@rule("E0510")
def check_mamba2_groups(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Mamba2 groups do not divide the heads.

    What it checks:
        For `mamba2`: `heads % groups == 0` (each group of heads shares one B and one C).

    Why it matters:
        The heads are split into `groups` equal groups; with a remainder some heads would have
        no B and C to read.

    Example:
        dim = 64
        mamba2(groups=3)

    Use instead:
        dim = 64
        mamba2(groups=2)
    """
    yield from constraint_errors(s, "E0510")


@rule("E0511")
def check_linear_normalizer(s: ShapeCtx) -> Iterator[Diagnostic]:
    """Normalised linear attention with identity features.

    What it checks:
        For `linear`: `normalize=true` together with `feature_map=identity` (the default of
        `normalize` is `false` for identity features).

    Why it matters:
        The normaliser divides by q̂ᵀz, the sum of products of the query's features with every
        past key's. Identity features have either sign, so the sum crosses zero: the output
        blows up near it, and a forward and a decode of the same tokens, which add the same
        terms in another order, give different results (mixers.md §1(e)).

    Example:
        dim = 1024
        linear(feature_map=identity, normalize=true)

    Use instead:
        dim = 1024
        linear(feature_map=identity, normalize=false)
    """
    yield from constraint_errors(s, "E0511")
