"""`mamba2`: Mamba2 / SSD (mixers.md §7), parameterized as mamba_ssm's `Mamba2`."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import CacheTensor, Flops, LayerSpec, Mode, Option, Opts, scaled
from lt2dsl.ir.specs.common import HEAD_DIM, conv_flops, lin, proj_flops
from lt2dsl.ir.specs.recurrent import chunk_of


def dims(o: Opts, D: int) -> tuple[int, int, int, int, int]:
    """(d_in, H, P, N, G): inner width expand·D, heads d_in/P, head dim P, state N, groups G."""
    d_in = scaled(D, o["expand"])
    return d_in, o["heads"], o["head_dim"], o["state"], o["groups"]


def _heads(cfg: ModelConfig | None, o: Opts) -> int:
    if cfg is None:
        return 1
    return max(1, scaled(cfg.dim, o.get("expand", 2)) // o.get("head_dim", 64))


@dataclass(frozen=True)
class Mamba2Spec(LayerSpec):
    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """in_proj, the conv, the gates (dt, v, log decay), the SSD step, the D skip, gated norm
        and out_proj."""
        return 7

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """in_proj (2·d_in + 2GN + H, D) → [z, x, B, C, dt]; conv1d on xBC with bias; dt_bias,
        A_log, D (H); gated RMSNorm weight (d_in); out_proj (D, d_in)."""
        d_in, H, P, N, G = dims(o, cfg.dim)
        xbc = d_in + 2 * G * N
        w = {"in_proj.weight": lin(2 * d_in + 2 * G * N + H, cfg.dim)}
        if o["conv"] > 0:
            w |= {"conv1d.weight": (xbc, 1, o["conv"]), "conv1d.bias": (xbc,)}
        return w | {
            "dt_bias": (H,),
            "A_log": (H,),
            "D": (H,),
            "norm.weight": (d_in,),
            "out_proj.weight": lin(cfg.dim, d_in),
        }

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """ssm state (B, H, N, P) in the state dtype + conv buffer (B, d_in + 2GN, W−1)."""
        d_in, H, P, N, G = dims(o, cfg.dim)
        c = {"state": CacheTensor((batch, H, N, P), "state", "state")}
        if o["conv"] > 1:
            c["xbc_conv"] = CacheTensor((batch, d_in + 2 * G * N, o["conv"] - 1), "state", "act")
        return c

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        """Core per head: chunked 2CN·G/H + 2CP + 4PN, decode 5PN + 2P (mixers.md §7(d))."""
        d_in, H, P, N, G = dims(o, cfg.dim)
        proj = proj_flops(self.weights(o, cfg), ["in_proj.weight", "out_proj.weight"])
        proj += conv_flops(d_in + 2 * G * N, o["conv"])
        C = chunk_of(L)
        core = 5 * P * N + 2 * P if mode == "decode" else 2 * C * N * G / H + 2 * C * P + 4 * P * N
        return Flops(proj=proj, core=float(H * core))

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """in_proj's output (z and dt are read as views of it) and the conv's output x, B, C; the
        chunk op's C, B `[T, G, N]`, v = dt·x `[T, H, P]` and fp32 decay `[T, H]`; fp32 dt, the
        softplus input `[T, H]` and x `[T, H, P]` of the dt·x product; the gated norm's input y
        `[T, d_in]`: 7·d_in + 6GN + 7H."""
        d_in, H, P, N, G = dims(o, cfg.dim)
        return 7 * d_in + 6 * G * N + 7 * H


SPEC = Mamba2Spec(
    kind="mamba2",
    summary="Mamba2 / SSD: scalar-decay selective state space, x/B/C conv, gated RMSNorm",
    options=(
        Option(
            "heads", "int", "SSM heads = expand·dim / head_dim (derived when omitted)", default=_heads, min=1
        ),
        Option("head_dim", HEAD_DIM.type, "SSM head dim P", default=64, min=1),
        Option("mlp", "mlp", "channel mixer of this block"),
        Option("norm", "norm", "block norm"),
        Option("name", "str", "a label for reports"),
        Option("state", "int", "SSM state size N", default=128, min=1),
        Option("expand", "number", "inner width d_in = expand · dim", default=2, min=0, min_open=True),
        Option("groups", "int", "B/C groups G (heads of a group share B and C)", default=1, min=1),
        Option("conv", "int", "causal conv width on x, B, C (0: none)", default=4, min=0),
    ),
    module="lt2dsl.lowering.layers.mamba2:Mamba2",
    source="mixers.md §7 (arXiv 2405.21060); mamba_ssm `modules/mamba2.py`",
)
