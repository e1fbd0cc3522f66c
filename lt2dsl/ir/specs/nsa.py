"""`nsa`: native sparse attention — compressed, selected and sliding branches (mixers.md §10)."""

from __future__ import annotations

from dataclasses import dataclass

from lt2dsl.ir.nodes import ModelConfig
from lt2dsl.ir.spec import CacheTensor, Flops, LayerSpec, Mode, Option, Opts
from lt2dsl.ir.specs.common import COMMON, DECODE_SMS, cat_width, causal_mean, from_attention, lin, proj_flops
from lt2dsl.ir.specs.full import attention_core, rope_key

# The decode's compressed branch is split over programs above this many tiles of compressed keys
# (`kernels.nsa.triton_decode.cmp_splits`; a test holds the two equal).
CMP_SPLIT_TILES = 4


def n_cmp(t: int, l: int, s: int) -> int:
    """Compressed blocks entirely in the past of position t: blocks [i·s+1, i·s+l], i·s + l ≤ t."""
    return max(0, (t - l) // s + 1)


def mean_n_cmp(L: int, l: int, s: int) -> float:
    """Mean of n_cmp(t) over t = 1..L, in closed form (Σ_{j<m} (⌊j/s⌋ + 1), m = L − l + 1)."""
    m = L - l + 1
    if m <= 0:
        return 0.0
    q, r = divmod(m, s)
    return (m + s * q * (q - 1) // 2 + q * r) / L


@dataclass(frozen=True)
class NsaSpec(LayerSpec):
    def decode_kernels(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> int:
        """In-projection GEMM, RoPE into the cache, the compressed-key update, block selection
        (one launch; three while batch × kv heads leave SMs idle and more than four tiles of
        compressed keys are cached: the compressed branch split over programs, the blocks scored
        and ranked in slices, the row's top n of the slices'), split sparse attention and its
        combine, o_proj."""
        tile = 64 if o["head_dim"] <= 128 else 32  # `kernels.nsa.triton_decode.select_tile`
        nc = n_cmp(L, o["cmp_block"], o["stride"])
        return 7 + 2 * (batch * o["kv_heads"] < DECODE_SMS and nc > CMP_SPLIT_TILES * tile)

    def decode_once(self, o: Opts, cfg: ModelConfig) -> dict[tuple, int]:
        return {rope_key(o): 2}

    def weights(self, o: Opts, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """q (H·d, D), k / v (HKV·d, D), branch gates g_proj (3H, D), o (D, H·d); with
        `compress=mlp`, per k and v: an intra-block position embedding (l, d) and a linear
        map (d, l·d) with bias (the paper's learned φ)."""
        H, HKV, d, D = o["heads"], o["kv_heads"], o["head_dim"], cfg.dim
        w = {
            "q_proj.weight": lin(H * d, D),
            "k_proj.weight": lin(HKV * d, D),
            "v_proj.weight": lin(HKV * d, D),
            "g_proj.weight": lin(3 * H, D),
            "o_proj.weight": lin(D, H * d),
        }
        if o["compress"] == "mlp":
            lb = o["cmp_block"]
            for t in ("k", "v"):
                w |= {
                    f"cmp_{t}.pos": (lb, d),
                    f"cmp_{t}.proj.weight": lin(d, lb * d),
                    f"cmp_{t}.proj.bias": (d,),
                }
        return w

    def cache(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """Full KV (selection can address any past block) plus the compressed K/V so far."""
        HKV, d = o["kv_heads"], o["head_dim"]
        full = (batch, HKV, L, d)
        cmp = (batch, HKV, n_cmp(L, o["cmp_block"], o["stride"]), d)
        return {
            "k": CacheTensor(full, "kv", "kv"),
            "v": CacheTensor(full, "kv", "kv"),
            "k_cmp": CacheTensor(cmp, "kv", "kv"),
            "v_cmp": CacheTensor(cmp, "kv", "kv"),
        }

    def decode_read(self, o: Opts, cfg: ModelConfig, batch: int, L: int) -> dict[str, CacheTensor]:
        """Every compressed key and value; of the full k and v, the selected blocks and the window
        (at most min(L, n·l') + min(L, w) positions: they may overlap, counted apart as the
        three branches read them)."""
        HKV, d = o["kv_heads"], o["head_dim"]
        cache = self.cache(o, cfg, batch, L)
        seen = min(L, o["select"] * o["block"]) + min(L, o["window"])
        part = CacheTensor((batch, HKV, seen, d), "kv", "kv")
        return {"k": part, "v": part, "k_cmp": cache["k_cmp"], "v_cmp": cache["v_cmp"]}

    def prefill_gather(self, o: Opts, cfg: ModelConfig, L: int) -> float:
        """Each query's selected blocks, gathered per kv head (its group's heads share them):
        min(t, n·l') · HKV · 2d; the compressed and window branches are tiled."""
        return causal_mean(L, o["select"] * o["block"]) * o["kv_heads"] * 2 * o["head_dim"]

    def flops(self, o: Opts, cfg: ModelConfig, L: int, mode: Mode, causal: str = "exact") -> Flops:
        """Per query head: 4d·(n_cmp(t) + min(t, n·l') + min(t, w)) (mixers.md §10(d))."""
        w = self.weights(o, cfg)
        proj = proj_flops(
            w, ["q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight", "o_proj.weight"]
        )
        lb, s, d = o["cmp_block"], o["stride"], o["head_dim"]
        if o["compress"] == "mlp":  # one φ application per stride tokens, for k and v
            proj += 2 * (2.0 * lb * d * d) * o["kv_heads"] / s
        sel = o["select"] * o["block"]
        if mode == "decode":
            keys = n_cmp(L, lb, s) + min(L, sel) + min(L, o["window"])
        elif causal == "full":
            keys = n_cmp(L, lb, s) + 2 * L
        else:
            keys = mean_n_cmp(L, lb, s) + causal_mean(L, sel) + causal_mean(L, o["window"])
        return Flops(proj=proj, core=attention_core(o["heads"], d, keys))

    def kept_outputs(self, o: Opts, cfg: ModelConfig) -> int:
        """The compressed and selected branches' attention ops, and the window's when it has one:
        each o `[T, H, d]` and its fp32 log-sum-exp `[T, H]`."""
        return (2 + (o["window"] > 0)) * (o["heads"] * o["head_dim"] + 2 * o["heads"])

    def activations(self, o: Opts, cfg: ModelConfig) -> int:
        """The σ branch gates `[T, H, 3]`; rotated q `[T, H, d]`, k and v `[T, HKV, d]`; per
        branch the attention output `[T, H, d]` and fp32 log-sum-exp `[T, H]`, and the fp32
        output and gate its weighted sum multiplies; the compressed keys and values, one per
        `stride` tokens `[T/stride, HKV, d]`; the selection op's v (a view of the fused q, k, v, g
        projection, so all of that) and its int64 selected positions `[T, HKV, select·block]`;
        o_proj's input `[T, H, d]`; with `compress=mlp` the φ's inputs, each compressed block's
        `cmp_block` keys (values) flattened `[T/stride, HKV, l·d]`:
        11Hd + 15H + 2·HKV·d·(1 + 1/stride) + projection + 4·HKV·n·l' (+ 2·HKV·l·d/stride)."""
        H, HKV, d = o["heads"], o["kv_heads"], o["head_dim"]
        proj = cat_width(
            self.weights(o, cfg), ["q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight"]
        )
        cmp = 2 * HKV * d * (o["cmp_block"] + 1 if o["compress"] == "mlp" else 1)
        cmp = -(-cmp // o["stride"])
        return 11 * H * d + 15 * H + 2 * HKV * d + cmp + proj + 4 * HKV * o["select"] * o["block"]


SPEC = NsaSpec(
    kind="nsa",
    summary="native sparse attention: compressed, selected and sliding-window branches, gated",
    options=(
        *COMMON,
        Option("block", "size", "selection block size l'", default=64, min=1),
        Option(
            "select",
            "int",
            "selected blocks per query n (forced first and local ones included)",
            default=16,
            min=1,
        ),
        Option("window", "size", "sliding-window branch size w (keys including self)", default=512, min=1),
        Option("cmp_block", "size", "compression block size l", default=32, min=1),
        Option(
            "stride", "size", "compression stride d (must divide `cmp_block` and `block`)", default=16, min=1
        ),
        Option("kv_heads", "int", "key/value heads; must divide `heads`", default=1, min=1),
        Option(
            "compress",
            "enum",
            "compression φ: mean pooling (fla) or the paper's learned MLP",
            default="mean",
            choices=("mean", "mlp"),
        ),
        Option("rope_theta", "float", "RoPE base", default=10000.0, min=0, min_open=True),
    ),
    from_attention=from_attention(k="kv_heads", v="kv_heads"),
    module="lt2dsl.lowering.layers.nsa:NativeSparseAttention",
    source="mixers.md §10 (arXiv 2502.11089); fla `fla/ops/nsa/naive.py`, `fla/layers/nsa.py`",
)
