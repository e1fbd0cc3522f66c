"""What a resolved mixer must satisfy to lower: one predicate per rule, for both sides.

Each `Constraint` names the diagnostic code that reports it, the kinds it applies to and the
options a diagnostic points at. The validator (`lt2dsl/validate/shapes.py`) turns a `Problem`
into a diagnostic at what the user wrote; the lowering calls `require` with the same options
and raises the same message as a `ValueError` (a resolved `Model` built in Python never went
through the validator). A rule the kernels impose is written here once, never re-derived in a
layer. Torch-free: the estimate path imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from lt2dsl.ir.limits import depth_problem, max_value
from lt2dsl.ir.nodes import LoopBlock, Model, ModelConfig
from lt2dsl.ir.registry import lookup
from lt2dsl.ir.settings import MODEL_SETTINGS
from lt2dsl.ir.spec import Option, Opts, exact, show
from lt2dsl.suggest import quoted

# Kinds with key/value heads shared by groups of query heads (`gla`: fla's `num_kv_heads`).
KV_GROUPED = ("full", "swa", "dsa", "nsa", "gla")
# Kinds that rotate query/key dims in pairs (RoPE, half-split): the head dim must be even.
ROTARY = ("full", "swa", "dsa", "nsa", "retnet")
# Kinds with partial RoPE and RoPE scaling options (`rope_dim`, `rope_scaling`, …).
ROPE_OPTIONS = ("full", "swa")
# kind → (factor option, what the product is)
DERIVED = {
    "gdn": ("expand_v", "value head dim"),
    "kda": ("expand_v", "value head dim"),
    "retnet": ("expand_v", "value head dim"),
    "gla": ("expand_k", "key head dim"),
    "mlstm": ("qk_dim_factor", "key head dim"),
}


@dataclass(frozen=True)
class Problem:
    message: str
    label: str
    help: str


@dataclass(frozen=True)
class Constraint:
    """`check(kind, opts, cfg)` is None when the rule holds. `options` are where a diagnostic
    points, most specific first; `inherits` when those options default to model settings."""

    code: str
    kinds: tuple[str, ...]
    options: Callable[[str], tuple[str, ...]]
    check: Callable[[str, Opts, ModelConfig], Problem | None]
    inherits: bool = True


def divisors(x: int, limit: int = 6) -> str:
    """The smallest divisors of x as "`1`, `2` and `4`" (the help line's candidates); found up
    to √x, so a limit-sized width costs microseconds."""
    small, large, d = [], [], 1
    while d * d <= x:
        if x % d == 0:
            small.append(d)
            if d * d != x:
                large.append(x // d)
        d += 1
    ds = small + large[::-1]
    return quoted(str(d) for d in ds[:limit]) + (" …" if len(ds) > limit else "")


def must_divide(part: int, whole: int, option: str, message: str, label: str) -> Problem | None:
    """None when `part` divides `whole`; else the problem, whose help lists the divisors of `whole`
    that `option` (the option setting `part`) could take."""
    if whole % part == 0:
        return None
    return Problem(message, label, f"choose `{option}` dividing {whole}: {divisors(whole)}")


def kv_problem(H: int, KV: int, whose: str = "") -> Problem | None:
    """`heads` not a multiple of `kv_heads`; `whose` (" of `kind`", or "" for the model's settings)
    follows `kv_heads` in the message."""
    if KV <= H:
        label = f"{H} query heads do not split into groups of {KV} key/value heads"
    else:
        label = f"more key/value heads ({KV}) than query heads ({H})"
    message = f"`heads` ({H}) is not a multiple of `kv_heads` ({KV}){whose}"
    return must_divide(KV, H, "kv_heads", message, label)


def kv_heads_divide(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    return kv_problem(o["heads"], o["kv_heads"], f" of `{kind}`")


def value_heads_divide(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    H, HV = o["heads"], o["v_heads"]
    if HV % H == 0:
        return None
    return Problem(
        f"`v_heads` ({HV}) of `{kind}` is not a multiple of `heads` ({H})",
        f"{HV} value heads cannot be shared evenly by {H} query/key heads",
        f"choose `v_heads` as a multiple of {H}: {H}, {2 * H}, {4 * H}, …",
    )


def derived_head_dim(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    factor, what = DERIVED[kind]
    d, f = o["head_dim"], o[factor]
    prod = exact(d) * exact(f)
    if prod.denominator == 1 and prod >= 1:
        return None
    whole = prod.denominator == 1
    return Problem(
        f"`{kind}` {what} `head_dim · {factor}` = {d} · {show(f)} "
        + ("is less than 1" if whole else f"= {show(prod)} is not a whole number"),
        f"gives a {what} of {show(prod)}",
        f"choose `head_dim` and `{factor}` whose product is a whole number",
    )


def mamba2_width(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    H, P = o["heads"], o["head_dim"]
    d_in = exact(o["expand"]) * cfg.dim
    if d_in == H * P:
        return None
    return Problem(
        f"`mamba2` heads · head_dim = {H} · {P} = {H * P} does not equal expand · dim = {show(d_in)}",
        "heads do not tile the inner width",
        f"choose `head_dim` dividing {show(d_in)}, or set `heads` so that heads · head_dim = {show(d_in)}",
    )


def mamba2_groups(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    H, G = o["heads"], o["groups"]
    message = f"`mamba2` groups ({G}) do not divide the heads ({H})"
    return must_divide(G, H, "groups", message, f"{H} heads do not split into {G} groups sharing B and C")


def tmm_heads(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    H, D = o["heads"], cfg.dim
    message = f"`tmm` heads ({H}) do not divide `dim` ({D})"
    return must_divide(H, D, "heads", message, f"{D} channels do not split into {H} equal groups")


def tmm_kernel_fits(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    k = o["kernel"]
    if k <= cfg.dim:
        return None
    return Problem(
        f"`tmm` kernel ({k}) taps more channels than the model has (`dim` = {cfg.dim})",
        f"{k} taps, {cfg.dim} channels to tap",
        f"choose `kernel` <= {cfg.dim}",
    )


def nsa_stride(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    st = o["stride"]
    bad = [f"`{k}` ({o[k]})" for k in ("cmp_block", "block") if o[k] % st]
    if not bad:
        return None
    return Problem(
        f"`nsa` stride ({st}) does not divide {' and '.join(bad)}",
        "stride must divide the block sizes",
        f"choose a stride dividing {o['cmp_block']} and {o['block']}",
    )


def rope_pairs(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    d = o["head_dim"]
    if d % 2 == 0:
        return None
    return Problem(
        f"`{kind}` rotates query/key dims in pairs (RoPE), but `head_dim` ({d}) is odd",
        "an odd head dim has a dim without a partner",
        "choose an even `head_dim` (with `heads` so that heads · head_dim fits the model)",
    )


def rope_dim_fits(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    d = o["head_dim"]
    r = o.get("rope_dim", d)
    # a whole odd head rotated is E0509's problem (the head dim), not the rotated width's
    if r <= d and (r % 2 == 0 or r == d):
        return None
    return Problem(
        f"`rope_dim` ({r}) of `{kind}` must be even and at most `head_dim` ({d})",
        "RoPE rotates pairs of the first `rope_dim` dims of a head",
        f"choose an even `rope_dim` <= {d}, e.g. {d // 2 // 2 * 2 or 2}",
    )


def rope_freq_factors(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    if o.get("rope_scaling") != "llama3":
        return None
    lo, hi = o["rope_low_freq"], o["rope_high_freq"]
    if hi > lo:
        return None
    return Problem(
        f"`rope_high_freq` ({show(hi)}) of `{kind}` must be greater than `rope_low_freq` ({show(lo)})",
        "Llama 3 scaling interpolates between the two wavelengths",
        "Llama 3.x checkpoints use `rope_low_freq=1, rope_high_freq=4`",
    )


def positive_features(kind: str, o: Opts, cfg: ModelConfig) -> Problem | None:
    if not (o["normalize"] and o["feature_map"] == "identity"):
        return None
    return Problem(
        "`linear` divides by q̂ᵀz, which identity features can make zero or negative",
        "the normaliser needs features that are never negative",
        "write `normalize=false` (a per-head RMSNorm on the output instead), or use a feature map "
        "that is never negative: `elu1`, `relu`, `hedgehog`",
    )


CONSTRAINTS = (
    Constraint("E0501", KV_GROUPED, lambda k: ("kv_heads", "heads"), kv_heads_divide),
    Constraint("E0502", ("gdn", "kda"), lambda k: ("v_heads", "heads"), value_heads_divide),
    Constraint("E0503", tuple(DERIVED), lambda k: (DERIVED[k][0], "head_dim"), derived_head_dim),
    Constraint("E0504", ("mamba2",), lambda k: ("heads", "head_dim", "expand"), mamba2_width, False),
    Constraint("E0505", ("tmm",), lambda k: ("heads",), tmm_heads, False),
    Constraint("E0507", ("nsa",), lambda k: ("stride", "cmp_block", "block"), nsa_stride, False),
    Constraint("E0509", ROTARY, lambda k: ("head_dim",), rope_pairs),
    Constraint("E0510", ("mamba2",), lambda k: ("groups", "heads"), mamba2_groups, False),
    Constraint("E0511", ("linear",), lambda k: ("normalize", "feature_map"), positive_features, False),
    Constraint("E0512", ("tmm",), lambda k: ("kernel",), tmm_kernel_fits, False),
    Constraint("E0520", ROPE_OPTIONS, lambda k: ("rope_dim", "head_dim"), rope_dim_fits),
    Constraint(
        "E0521", ROPE_OPTIONS, lambda k: ("rope_high_freq", "rope_low_freq"), rope_freq_factors, False
    ),
)
BY_CODE = {c.code: c for c in CONSTRAINTS}


def problems(kind: str, opts: Opts, cfg: ModelConfig) -> Iterator[tuple[Constraint, Problem]]:
    """Every constraint of `kind` that `opts` break, in code order."""
    for c in CONSTRAINTS:
        if kind in c.kinds and (p := c.check(kind, opts, cfg)) is not None:
            yield c, p


def require(kind: str, opts: Opts, cfg: ModelConfig) -> None:
    """Raise `ValueError` (the validator's message and help) when `opts` break a constraint
    or an option is past lt2dsl's limit (E0204)."""
    for c, p in problems(kind, opts, cfg):
        raise ValueError(f"{p.message} [{c.code}]; {p.help}")
    spec = lookup(kind)
    for o in spec.options if spec is not None else ():
        _require_limit(o, opts.get(o.name), f"option `{o.name}` of `{kind}`")


def require_model(model: Model) -> None:
    """Raise `ValueError` when a resolved model's settings pass lt2dsl's limits (E0204) or it
    applies more blocks than the lowering unrolls (E0205); each mixer is checked by `require`."""
    for o in MODEL_SETTINGS:
        _require_limit(o, getattr(model.config, o.name, None), f"setting `{o.name}`")
    applied = sum(it for _, it in _blocks(model.body))
    if (message := depth_problem(applied)) is not None:
        raise ValueError(f"{message} [E0205]; lower a loop count")


def _require_limit(o: Option, value, what: str) -> None:
    limit = max_value(o)
    if limit is not None and isinstance(value, int) and value > limit:
        raise ValueError(f"{what} is {value}, above lt2dsl's limit [E0204]; it accepts up to {limit:,}")


def _blocks(stages, mult: int = 1) -> Iterator[tuple[object, int]]:
    for s in stages:
        if isinstance(s, LoopBlock):
            yield from _blocks(s.body, mult * s.T)
        else:
            yield s, mult
