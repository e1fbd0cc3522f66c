"""IR nodes: small, frozen, closed pydantic models, discriminated on `kind`.

Two layers of nodes:
* the *surface* IR that the parser builds and the printer prints (`Program`, `Setting`, `Let`,
  `Call`, `Loop`, `Repeat`, `Par`, `Times` and the value nodes) — it says exactly what the user
  wrote, with a `Span` on every node;
* the *resolved* IR that the resolve passes build and cost / lowering consume (`Model`,
  `ModelConfig`, `Block`, `Mixer`, `LoopBlock`) — lets expanded, copies unrolled, every option
  filled in.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lt2dsl.dtypes import DEFAULT_DTYPE, DEFAULT_STATE_DTYPE
from lt2dsl.source import NOWHERE, Span


class Node(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    span: Span = NOWHERE


# ---- values ----------------------------------------------------------------------------------


class Int(Node):
    kind: Literal["int"] = "int"
    value: int


class Float(Node):
    kind: Literal["float"] = "float"
    value: float


class Frac(Node):
    """An exact fraction such as `8/3`, kept exact until a formula uses it."""

    kind: Literal["frac"] = "frac"
    num: int
    den: int

    @property
    def value(self) -> Fraction:
        return Fraction(self.num, self.den)


class Str(Node):
    kind: Literal["str"] = "str"
    value: str


class Bool(Node):
    kind: Literal["bool"] = "bool"
    value: bool


class NoneVal(Node):
    kind: Literal["none"] = "none"


class Name(Node):
    """A bare identifier in value position: an enum value (`gate=sdpa`) or a kind (`mlp=swiglu`)."""

    kind: Literal["name"] = "name"
    value: str


class Arg(Node):
    """`name=value`, or a positional `value` (name is None)."""

    kind: Literal["arg"] = "arg"
    name: str | None = None
    value: Value
    # Span of the option name alone (the value has its own span); NOWHERE when positional.
    name_span: Span = NOWHERE


class Call(Node):
    """`name` or `name(args)`: a layer call in a stack, or a call value (`swiglu(hidden=8192)`)."""

    kind: Literal["call"] = "call"
    name: str
    args: tuple[Arg, ...] = ()
    name_span: Span = NOWHERE
    # Comments attached by the parser so `lt2dsl fmt` keeps them (not part of the meaning).
    comments: tuple[str, ...] = Field(default=(), repr=False)
    trailing: str | None = Field(default=None, repr=False)

    def arg(self, name: str) -> Arg | None:
        return next((a for a in self.args if a.name == name), None)


Value = Annotated[
    Int | Float | Frac | Str | Bool | NoneVal | Name | Call,
    Field(discriminator="kind"),
]

# ---- stack items -----------------------------------------------------------------------------


class Loop(Node):
    """`loop T=n, opts < stack >`: the stack applied n times with the same weights."""

    kind: Literal["loop"] = "loop"
    T: int
    options: tuple[Arg, ...] = ()
    body: tuple[Item, ...] = ()
    T_span: Span = NOWHERE
    comments: tuple[str, ...] = Field(default=(), repr=False)
    trailing: str | None = Field(default=None, repr=False)


class Repeat(Node):
    """`repeat n < stack >`: n copies with separate weights."""

    kind: Literal["repeat"] = "repeat"
    n: int
    body: tuple[Item, ...] = ()
    n_span: Span = NOWHERE
    comments: tuple[str, ...] = Field(default=(), repr=False)
    trailing: str | None = Field(default=None, repr=False)


class Par(Node):
    """`par(a, b, ...)`: several mixers on the same normed input, outputs summed, one block."""

    kind: Literal["par"] = "par"
    calls: tuple[Call, ...]
    comments: tuple[str, ...] = Field(default=(), repr=False)
    trailing: str | None = Field(default=None, repr=False)


class Times(Node):
    """`item * n`: n copies of item with separate weights."""

    kind: Literal["times"] = "times"
    item: Item
    n: int
    n_span: Span = NOWHERE
    comments: tuple[str, ...] = Field(default=(), repr=False)
    trailing: str | None = Field(default=None, repr=False)


Item = Annotated[Call | Loop | Repeat | Par | Times, Field(discriminator="kind")]

# ---- top level -------------------------------------------------------------------------------


class Setting(Node):
    kind: Literal["setting"] = "setting"
    name: str
    value: Value
    name_span: Span = NOWHERE
    comments: tuple[str, ...] = Field(default=(), repr=False)
    trailing: str | None = Field(default=None, repr=False)


class Let(Node):
    kind: Literal["let"] = "let"
    name: str
    item: Item
    name_span: Span = NOWHERE
    comments: tuple[str, ...] = Field(default=(), repr=False)
    trailing: str | None = Field(default=None, repr=False)


class Program(Node):
    """A whole file. `name` is None for a bare body without a `model { }` header."""

    kind: Literal["program"] = "program"
    name: str | None = None
    settings: tuple[Setting, ...] = ()
    lets: tuple[Let, ...] = ()
    body: tuple[Item, ...] = ()
    header: tuple[str, ...] = Field(default=(), repr=False)  # comment lines before the model
    footer: tuple[str, ...] = Field(default=(), repr=False)  # comment lines after the last item

    def setting(self, name: str) -> Setting | None:
        return next((s for s in self.settings if s.name == name), None)


# ---- resolved IR -----------------------------------------------------------------------------


class MlpSpec(Node):
    """Channel mixer of a block: `swiglu` / `geglu` (gate, up, down), `gelu` (up, down) or `none`."""

    kind: Literal["mlp"] = "mlp"
    type: Literal["swiglu", "geglu", "gelu", "none"]
    hidden: int = 0


class NormSpec(Node):
    """Block norm: pre-norm (`rmsnorm` / `layernorm`) or Ouro's sandwich form of that norm.

    `offset`: an rmsnorm that scales by (1 + weight), its weights stored as offsets from one (Gemma).
    """

    kind: Literal["norm"] = "norm"
    type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    eps: float = 1e-6
    sandwich: bool = False
    offset: bool = False


class ModelConfig(Node):
    """Model-wide settings with every default filled in."""

    kind: Literal["config"] = "config"
    name: str = "model"
    dim: int
    vocab: int = 32000
    heads: int
    head_dim: int
    kv_heads: int
    mlp: MlpSpec
    norm: NormSpec
    max_len: int = 8192
    tie_embeddings: bool = True
    embed_scale: bool = False  # embeddings × sqrt(dim) (Gemma)
    head: bool = True  # False: `head = none`, a backbone returning hidden states
    dtype: str = DEFAULT_DTYPE
    state_dtype: str = DEFAULT_STATE_DTYPE


class Mixer(Node):
    """One token mixer with all its options resolved (`opts` includes heads and head_dim)."""

    kind: Literal["mixer"] = "mixer"
    type: str  # canonical layer kind, aliases resolved (`window` -> `swa`)
    opts: dict[str, Any]
    label: str | None = None  # `name="..."` on the call


class Block(Node):
    """One residual block: `h += mixer(norm(h)); h += mlp(norm(h))` (or the sandwich form).

    `mixers` has one entry, or several for `par(...)` (outputs summed). `id` is stable and
    unique in the model, e.g. `loop0/2:gdn`, and keys weights, caches and report rows.
    """

    kind: Literal["block"] = "block"
    id: str
    mixers: tuple[Mixer, ...]
    mlp: MlpSpec
    norm: NormSpec


class ExitGate(Node):
    kind: Literal["exit_gate"] = "exit_gate"
    threshold: float = 0.9


class LoopBlock(Node):
    """`loop T=n < ... >` after resolution: body applied T times with shared weights."""

    kind: Literal["loop_block"] = "loop_block"
    id: str
    T: int
    final_norm: bool = False
    inject: Literal["none", "add", "concat"] = "none"
    exit: ExitGate | None = None
    body: tuple[Stage, ...]


Stage = Annotated[Block | LoopBlock, Field(discriminator="kind")]


class Model(Node):
    """The resolved program: what cost and lowering consume."""

    kind: Literal["model"] = "model"
    config: ModelConfig
    body: tuple[Stage, ...]


for _cls in (Arg, Call, Loop, Repeat, Times, Let, Setting, Program, LoopBlock, Model):
    _cls.model_rebuild()
