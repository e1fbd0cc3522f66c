"""Shapes (E05xx, W05xx): head counts, head dims and widths that must fit together.

These rules read the resolved model (every default filled in), so they run only when the surface
rules found no error; each problem points at the value the user wrote, else at the model setting
the value came from, else at the call.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

from lt2dsl.diagnostics import Diagnostic, error, warning
from lt2dsl.ir import nodes as n
from lt2dsl.ir.printer import size
from lt2dsl.suggest import quoted
from lt2dsl.validate.context import Ctx, ShapeCtx
from lt2dsl.validate.rules import rule

# Kinds with key/value heads shared by groups of query heads (`gla`: fla's `num_kv_heads`).
ATTENTION = ("full", "swa", "dsa", "nsa", "gla")
# Kinds whose heads / head_dim / kv_heads default to the model settings of the same name.
INHERITS = ("heads", "head_dim", "kv_heads")


def exact(x) -> Fraction:
    """An option value as an exact fraction (floats by their shortest decimal form, `0.3` → 3/10)."""
    return Fraction(repr(x)) if isinstance(x, float) else Fraction(x)


def divisors(x: int, limit: int = 6) -> str:
    ds = [d for d in range(1, x + 1) if x % d == 0]
    return quoted(str(d) for d in ds[:limit]) + (" …" if len(ds) > limit else "")


def show(x) -> str:
    """`37.5` for a short decimal, `100/3` for a fraction that has none."""
    x = exact(x)
    if x.denominator == 1:
        return str(x.numerator)
    d = x.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    return f"{float(x):g}" if d == 1 and len(f"{float(x):g}") < 10 else f"{x.numerator}/{x.denominator}"


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
    if "kv_heads" in s.settings and cfg.heads % cfg.kv_heads:
        yield _kv_error(cfg.heads, cfg.kv_heads, s.setting_span("kv_heads"))
    for m in s.mixers():
        if m.type not in ATTENTION:
            continue
        call = s.call_of(m)
        if s.written(call, "heads") is None and s.written(call, "kv_heads") is None:
            continue  # both come from the model: reported once above
        H, KV = m.opts["heads"], m.opts["kv_heads"]
        if H % KV:
            yield _kv_error(H, KV, s.where(m, ("kv_heads", "heads"), INHERITS), m.type)


def _kv_error(H: int, KV: int, span, kind: str | None = None) -> Diagnostic:
    where = f" of `{kind}`" if kind else ""
    return error(
        "E0501",
        f"`heads` ({H}) is not a multiple of `kv_heads` ({KV}){where}",
        span,
        label=f"{H} query heads do not split into groups of {KV} key/value heads"
        if KV <= H
        else f"more key/value heads ({KV}) than query heads ({H})",
        help=f"choose `kv_heads` dividing {H}: {divisors(H)}",
    )


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
    for m in s.mixers():
        if "v_heads" not in m.opts:
            continue
        H, HV = m.opts["heads"], m.opts["v_heads"]
        if HV % H:
            yield error(
                "E0502",
                f"`v_heads` ({HV}) of `{m.type}` is not a multiple of `heads` ({H})",
                s.where(m, ("v_heads", "heads"), INHERITS),
                label=f"{HV} value heads cannot be shared evenly by {H} query/key heads",
                help=f"choose `v_heads` as a multiple of {H}: {H}, {2 * H}, {4 * H}, …",
            )


# kind → (factor option, what the product is)
DERIVED = {
    "gdn": ("expand_v", "value head dim"),
    "kda": ("expand_v", "value head dim"),
    "retnet": ("expand_v", "value head dim"),
    "gla": ("expand_k", "key head dim"),
    "mlstm": ("qk_dim_factor", "key head dim"),
}


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
    for m in s.mixers():
        if m.type not in DERIVED:
            continue
        factor, what = DERIVED[m.type]
        d, f = m.opts["head_dim"], m.opts[factor]
        prod = exact(d) * exact(f)
        if prod.denominator == 1 and prod >= 1:
            continue
        yield error(
            "E0503",
            f"`{m.type}` {what} `head_dim · {factor}` = {d} · {show(f)} = {show(prod)} is not a whole number"
            if prod.denominator != 1
            else f"`{m.type}` {what} `head_dim · {factor}` = {d} · {show(f)} is less than 1",
            s.where(m, (factor, "head_dim"), INHERITS),
            label=f"gives a {what} of {show(prod)}",
            help=f"choose `head_dim` and `{factor}` whose product is a whole number",
        )


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
    for m in s.mixers():
        if m.type != "mamba2":
            continue
        H, P = m.opts["heads"], m.opts["head_dim"]
        d_in = exact(m.opts["expand"]) * s.cfg.dim
        if d_in == H * P:
            continue
        yield error(
            "E0504",
            f"`mamba2` heads · head_dim = {H} · {P} = {H * P} does not equal expand · dim = {show(d_in)}",
            s.where(m, ("heads", "head_dim", "expand")),
            label="heads do not tile the inner width",
            help=f"choose `head_dim` dividing {show(d_in)}, or set `heads` so that "
            f"heads · head_dim = {show(d_in)}",
        )


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
    for m in s.mixers():
        if m.type == "tmm" and s.cfg.dim % m.opts["heads"]:
            H = m.opts["heads"]
            yield error(
                "E0505",
                f"`tmm` heads ({H}) do not divide `dim` ({s.cfg.dim})",
                s.where(m, ("heads",)),
                label=f"{s.cfg.dim} channels do not split into {H} equal groups",
                help=f"choose `heads` dividing {s.cfg.dim}: {divisors(s.cfg.dim)}",
            )


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
    for m in s.mixers():
        if m.type != "nsa":
            continue
        st = m.opts["stride"]
        bad = [f"`{k}` ({m.opts[k]})" for k in ("cmp_block", "block") if m.opts[k] % st]
        if bad:
            yield error(
                "E0507",
                f"`nsa` stride ({st}) does not divide {' and '.join(bad)}",
                s.where(m, ("stride", "cmp_block", "block")),
                label="stride must divide the block sizes",
                help=f"choose a stride dividing {m.opts['cmp_block']} and {m.opts['block']}",
            )


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
