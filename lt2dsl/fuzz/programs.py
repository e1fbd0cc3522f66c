"""Random well-formed `.lt2` programs over every layer kind, option and construct.

Options are drawn from each `Option` schema of the registry (types, ranges, choices), so a kind
or option added to a spec is generated without a change here. Values are mostly legal and
small (a model of width <= 64 runs on a CPU in milliseconds) but sometimes out of range, odd or
fractional, so that the shape rules and the constraints between options are exercised: a program
may be rejected by `check`, and whatever `check` accepts must lower and run.
"""

from __future__ import annotations

import random
from fractions import Fraction

from lt2dsl.ir.registry import REGISTRY
from lt2dsl.ir.settings import EXIT_GATE_OPTIONS
from lt2dsl.ir.spec import Option
from lt2dsl.ir.specs.channel import MLP_KINDS, NORM_KINDS

# Sequence lengths the runner uses stay below every max_len drawn here.
MIN_MAX_LEN = 16
SMALL_INTS = (1, 2, 3, 4, 4, 6, 8, 8, 16)
NUMBERS = ("1/2", "1", "2", "3/4", "33/2", "0.5", "1.5", "0.25", "2/3", "0.57", "1/4", "3")
# Widths: heads · head_dim stays small; odd values exercise the RoPE and divisibility rules.
WIDTH_OPTIONS = {"heads": (1, 1, 2, 2, 3, 4), "head_dim": (2, 3, 4, 8, 8, 16), "v_heads": (1, 2, 4)}
SIZE_OPTIONS = {
    "max_len": (16, 32, 64),
    "window": (1, 2, 4, 8, 64),
    "topk": (1, 2, 4, 8, 64),
    "hidden": (8, 16, 24, 64),
    "index_dim": (2, 4, 6, 8),
    "state": (1, 4, 8),
}
SETTINGS = {
    "dim": ("8", "16", "24", "32", "48", "64"),
    "vocab": ("16", "50", "64"),
    "heads": ("1", "2", "3", "4"),
    "head_dim": ("4", "6", "8", "16"),
    "kv_heads": ("1", "1", "2"),
    "max_len": ("16", "32", "64"),
}


def generate(rnd: random.Random) -> str:
    """One program: a few model settings, maybe `let`s, and a body of 1-4 items."""
    lines = [f"dim = {rnd.choice(SETTINGS['dim'])}", f"vocab = {rnd.choice(SETTINGS['vocab'])}"]
    for name in ("heads", "head_dim", "kv_heads", "max_len"):
        if rnd.random() < 0.3:
            lines.append(f"{name} = {rnd.choice(SETTINGS[name])}")
    if rnd.random() < 0.2:
        lines.append(f"mlp = {mlp_value(rnd)}")
    if rnd.random() < 0.2:
        lines.append(f"norm = {norm_value(rnd)}")
    if rnd.random() < 0.15:
        lines.append(f"tie_embeddings = {rnd.choice(('true', 'false'))}")
    if rnd.random() < 0.1:
        lines.append("head = none")
    if "max_len" not in " ".join(lines) and rnd.random() < 0.7:
        lines.append(f"max_len = {rnd.choice(SETTINGS['max_len'])}")
    lets = []
    if rnd.random() < 0.2:
        lets.append("b0")
        lines.append(f"let b0 = {call(rnd)}")
    lines += [item(rnd, depth=0, lets=lets) for _ in range(rnd.randint(1, 4))]
    return "\n".join(lines) + "\n"


def item(rnd: random.Random, depth: int, lets: list[str]) -> str:
    r = rnd.random()
    if depth < 2 and r < 0.25:
        opts = loop_options(rnd)
        return f"loop T={rnd.randint(1, 3)}{opts} < {stack(rnd, depth + 1, lets)} >"
    if depth < 2 and r < 0.32:
        return f"repeat {rnd.randint(1, 2)} < {stack(rnd, depth + 1, lets)} >"
    if r < 0.38:
        return f"{call(rnd)} * {rnd.randint(1, 2)}"
    if r < 0.45:
        return f"par({call(rnd)}, {call(rnd)})"
    if lets and r < 0.55:
        return lets[0]
    return call(rnd)


def stack(rnd: random.Random, depth: int, lets: list[str]) -> str:
    return "; ".join(item(rnd, depth, lets) for _ in range(rnd.randint(1, 3)))


def loop_options(rnd: random.Random) -> str:
    opts = []
    if rnd.random() < 0.25:
        opts.append(f"final_norm={rnd.choice(('true', 'false'))}")
    if rnd.random() < 0.25:
        opts.append(f"inject={rnd.choice(('none', 'add', 'concat'))}")
    if rnd.random() < 0.25:
        thr = value(EXIT_GATE_OPTIONS[0], rnd)
        opts.append(rnd.choice(("exit=gate", f"exit=gate(threshold={thr})", "exit=none")))
    if rnd.random() < 0.15:
        opts.append(f"norm={norm_value(rnd)}")
    return "".join(f", {o}" for o in opts)


def call(rnd: random.Random) -> str:
    """A layer call with a random subset of its options (each option about one time in three)."""
    spec = rnd.choice(list(REGISTRY.values()))
    name = rnd.choice((spec.kind, *spec.aliases))
    args = [f"{o.name}={value(o, rnd)}" for o in spec.options if rnd.random() < 0.3]
    return f"{name}({', '.join(args)})" if args else name


def value(o: Option, rnd: random.Random) -> str:
    """A value for option `o`: usually in range, sometimes not (about one time in thirty)."""
    match o.type:
        case "bool":
            return rnd.choice(("true", "false"))
        case "enum":
            return rnd.choice(o.choices)
        case "str":
            return '"b"'
        case "mlp":
            return mlp_value(rnd)
        case "norm":
            return norm_value(rnd)
    if rnd.random() < 1 / 30:
        return rnd.choice(("0", "-1", "1/2", "7"))
    if o.type in ("int", "size"):
        pool = WIDTH_OPTIONS.get(o.name) or SIZE_OPTIONS.get(o.name) or SMALL_INTS
        return str(_in_range(o, pool, rnd))
    return _number(o, rnd)


def _in_range(o: Option, pool, rnd: random.Random):
    ok = [x for x in pool if o.in_range(float(x))]
    return rnd.choice(ok or pool)


def _number(o: Option, rnd: random.Random) -> str:
    """A float or fraction option (`expand_v=3/4`, `gate_norm=33/2`, `lower_bound=-5`)."""
    pool = list(NUMBERS)
    if o.max is not None and o.max <= 0:
        pool = [f"-{x}" for x in pool]
    if o.name == "rope_theta":
        pool = ["10000", "500000.0", "1e4", "100"]
    if o.name == "threshold":
        pool = ["0.5", "0.9", "1", "1/3"]
    ok = [x for x in pool if o.in_range(float(Fraction(x)))]
    return rnd.choice(ok or pool)


def mlp_value(rnd: random.Random) -> str:
    kind = rnd.choice([*MLP_KINDS, "none"])
    if kind == "none" or rnd.random() < 0.4:
        return kind
    return f"{kind}(hidden={rnd.choice(SIZE_OPTIONS['hidden'])})"


def norm_value(rnd: random.Random) -> str:
    kind = rnd.choice(list(NORM_KINDS))
    if kind == "sandwich" or rnd.random() < 0.5:
        return kind
    return f"{kind}(eps={rnd.choice(('1e-6', '1e-5', '1/1000'))})"
