"""The static cost model: a resolved `Model` → `Report`. Never runs (or imports) torch.

Every figure comes from the layer specs' closed-form formulas (`lt2dsl/ir/specs/*`); this module
only folds them over blocks and loops and applies the roofline. The conventions it uses are
listed in `conventions()` and printed under every report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lt2dsl.cost.hardware import Hardware, load_hardware
from lt2dsl.cost.report import (
    BlockRow,
    Capacity,
    FlopsPerToken,
    Inputs,
    Memory,
    Params,
    Report,
    Roofline,
    Theory,
)
from lt2dsl.dtypes import Dtypes
from lt2dsl.ir import nodes as n
from lt2dsl.ir.constraints import require_model
from lt2dsl.ir.registry import lookup
from lt2dsl.ir.specs.channel import (
    block_decode_kernels,
    block_norm_count,
    lone_norm_kernels,
    mlp_activations,
    mlp_flops,
    mlp_weights,
    norm_saved,
    norm_weights,
)
from lt2dsl.passes.resolve import blocks as iter_blocks
from lt2dsl.passes.resolve import final_norm_applications
from lt2dsl.passes.resolve import loops as _loops


@dataclass(frozen=True)
class EstimateOptions:
    seq: int | None = None  # None: the model's max_len
    batch: int = 1
    gen: int = 0
    mode: str = "all"
    dtypes: Dtypes = field(default_factory=Dtypes)
    hw: Hardware = field(default_factory=lambda: load_hardware("h200"))
    causal: str = "exact"  # "exact" triangle | "full" square
    expand: bool = False
    exit_profile: tuple[float, ...] | None = None


# ---- per block ---------------------------------------------------------------------------------


def mixer_weights(m: n.Mixer, cfg: n.ModelConfig) -> dict[str, tuple[int, ...]]:
    return lookup(m.type).weights(m.opts, cfg)


def block_weights(b: n.Block, cfg: n.ModelConfig) -> dict[str, tuple[int, ...]]:
    """All parameter tensors of a block: mixers (prefixed `mixers.i.`), MLP, norms."""
    w: dict[str, tuple[int, ...]] = {}
    for i, m in enumerate(b.mixers):
        w |= {f"mixers.{i}.{k}": s for k, s in mixer_weights(m, cfg).items()}
    w |= {f"mlp.{k}": s for k, s in mlp_weights(b.mlp, cfg.dim).items()}
    for j in range(block_norm_count(b.norm, b.mlp.type != "none")):
        w |= {f"norms.{j}.{k}": s for k, s in norm_weights(b.norm, cfg.dim).items()}
    return w


def block_params(b: n.Block, cfg: n.ModelConfig) -> int:
    return sum(math.prod(s) for s in block_weights(b, cfg).values())


def block_cache(b: n.Block, cfg: n.ModelConfig, batch: int, L: int, dt: Dtypes) -> tuple[int, int]:
    """(state bytes, kv bytes) of one application of the block after L tokens."""
    state = kv = 0
    for m in b.mixers:
        for t in lookup(m.type).cache(m.opts, cfg, batch, L).values():
            if t.role == "state":
                state += t.nbytes(dt)
            else:
                kv += t.nbytes(dt)
    return state, kv


def block_decode_read(b: n.Block, cfg: n.ModelConfig, L: int, dt: Dtypes) -> int:
    """Bytes of growing cache one decode step of one sequence at context L reads (`decode_read`)."""
    return sum(t.nbytes(dt) for m in b.mixers for t in lookup(m.type).decode_read(m.opts, cfg, 1, L).values())


def block_flops(b: n.Block, cfg: n.ModelConfig, L: int, mode: str, causal: str) -> tuple[float, float]:
    """(total, mixer core) forward FLOPs per token of one application."""
    total = core = 0.0
    for m in b.mixers:
        f = lookup(m.type).flops(m.opts, cfg, L, mode, causal)
        total += f.total
        core += f.core
    return total + mlp_flops(b.mlp, cfg.dim), core


def block_activations(b: n.Block, cfg: n.ModelConfig) -> int:
    """Elements per token one application keeps for backward (no recomputation), at 2 bytes an
    element (an fp32 value counts twice): the mixers' own (`LayerSpec.activations`) and the MLP's
    (`mlp_activations`), and per half (mixer, MLP) its pre-norm and the normed input its
    projections read (D). The pre-norm is the add-norm kernel fused with the residual add before
    it (its sum and fp32 rstd, `norm_saved` fused) or a composite `OffsetRMSNorm`; a sandwich
    block's branch norm adds one fused norm per half."""
    halves = 2 if b.mlp.type != "none" else 1
    D, norm = cfg.dim, b.norm
    half = norm_saved(D, 1, norm.offset) + D
    if norm.sandwich:
        half += norm_saved(D, 1, norm.offset)
    acts = sum(lookup(m.type).activations(m.opts, cfg) for m in b.mixers)
    return acts + mlp_activations(b.mlp) + halves * half


def block_kept(b: n.Block, cfg: n.ModelConfig) -> int:
    """Elements per token one application keeps under selective per-application checkpointing
    beyond its input: its mixers' attention outputs (`LayerSpec.kept_outputs`)."""
    return sum(lookup(m.type).kept_outputs(m.opts, cfg) for m in b.mixers)


def options_text(m: n.Mixer, cfg: n.ModelConfig) -> str:
    """The options that differ from their defaults, as .lt2 would spell them."""
    spec = lookup(m.type)
    parts = []
    for o in spec.options:
        if o.name not in m.opts:
            continue
        v = m.opts[o.name]
        if v != o.default_for(cfg, m.opts):
            parts.append(f"{o.name}={_lt2(v)}")
    return ", ".join(parts)


def _lt2(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int) and v >= 1024 and v % 1024 == 0:
        return f"{v // 1024}k"
    return str(v)


# ---- model-level extras -------------------------------------------------------------------------


def extra_weights(model: n.Model) -> dict[str, tuple[int, ...]]:
    """Embedding, final norm, untied head, and each loop's adapter / exit gate."""
    cfg = model.config
    w = {"embed.weight": (cfg.vocab, cfg.dim)}
    w |= {f"final_norm.{k}": s for k, s in norm_weights(cfg.norm, cfg.dim).items()}
    if cfg.head and not cfg.tie_embeddings:
        w["lm_head.weight"] = (cfg.vocab, cfg.dim)
    for k, lp in enumerate(_loops(model.body)):
        if lp.inject == "concat":
            w[f"loops.{k}.adapter.weight"] = (cfg.dim, 2 * cfg.dim)
        if lp.exit is not None:
            w |= {f"loops.{k}.exit.weight": (1, cfg.dim), f"loops.{k}.exit.bias": (1,)}
    return w


def _loop_iterations(stages, mult: int = 1) -> dict[str, int]:
    """Applications of each loop's per-iteration extras: its T times enclosing loops' T."""
    out = {}
    for s in stages:
        if isinstance(s, n.LoopBlock):
            out[s.id] = mult * s.T
            out |= _loop_iterations(s.body, mult * s.T)
    return out


def model_weights(model: n.Model) -> dict[str, tuple[int, ...]]:
    """Every stored parameter tensor of the model: `blocks.<i>.` prefixes in block order."""
    w = extra_weights(model)
    for i, (b, _) in enumerate(iter_blocks(model.body)):
        w |= {f"blocks.{i}.{k}": s for k, s in block_weights(b, model.config).items()}
    return w


# ---- the report ----------------------------------------------------------------------------------


def estimate(model: n.Model, opt: EstimateOptions | None = None) -> Report:
    require_model(model)  # the validator's limits (E0204, E0205), for a Model built in Python
    opt = opt or EstimateOptions()
    cfg = model.config
    L = opt.seq or cfg.max_len
    dt = opt.dtypes.resolve(cfg.dtype, cfg.state_dtype)
    rows = [_row(b, it, cfg, L, opt, dt) for b, it in iter_blocks(model.body)]
    extras = _extra_rows(model, L, opt, dt)
    every = rows + extras
    stored = sum(r.params_stored for r in every)
    executed = sum(r.params_executed for r in every)
    embed = cfg.vocab * cfg.dim
    prefill = sum(r.flops_prefill * r.iterations for r in every)
    decode = sum(r.flops_decode * r.iterations for r in every)
    train = sum(r.flops_prefill * r.iterations * (1 + _bwd(model, r.id)) for r in every)
    state = sum(r.state_bytes * r.iterations for r in rows) * opt.batch
    kv = sum(r.kv_bytes * r.iterations for r in rows) * opt.batch
    weights_bytes = stored * dt.nbytes("act")
    memory = Memory(
        weights_bytes=weights_bytes,
        state_bytes=state,
        kv_bytes=kv,
        cache_bytes=state + kv,
        **_train_activations(model, L, opt.batch, dt),
    )
    roof = _roofline(model, rows, extras, L, opt, dt, prefill, decode, state + kv)
    return Report(
        inputs=Inputs(
            model=cfg.name,
            seq=L,
            batch=opt.batch,
            gen=opt.gen,
            mode=opt.mode,
            dtype=dt.act,
            state_dtype=dt.state,
            kv_dtype=dt.kv,
            hw=opt.hw.name,
            causal=opt.causal,
        ),
        params=Params(
            stored=stored,
            executed=executed,
            embedding=embed,
            embedding_share=embed / stored if stored else 0.0,
        ),
        flops_per_token=FlopsPerToken(
            prefill=prefill,
            decode=decode,
            train=train,
            decode_expected=_expected_decode(model, rows, extras, opt),
        ),
        memory=memory,
        roofline=roof,
        capacity=_capacity(model, L, opt, dt, weights_bytes),
        theory=_theory(model),
        blocks=_expand(rows, model) if opt.expand else rows,
        extras=extras,
        conventions=conventions(opt),
    )


def _bwd(model: n.Model, block_id: str) -> float:
    for b, _ in iter_blocks(model.body):
        if b.id == block_id:
            return max(lookup(m.type).backward_factor(m.opts) for m in b.mixers)
    return 2.0


def _row(b: n.Block, it: int, cfg: n.ModelConfig, L: int, opt: EstimateOptions, dt: Dtypes) -> BlockRow:
    params = block_params(b, cfg)
    fp, cp = block_flops(b, cfg, L, "prefill", opt.causal)
    fd, cd = block_flops(b, cfg, L, "decode", opt.causal)
    state, kv = block_cache(b, cfg, 1, L, dt)
    _, kv_prev = block_cache(b, cfg, 1, max(L - 1, 0), dt)
    # Per decoded token: weights amortized over the batch, state read + written, the KV the step
    # addresses read (all of it, or the top-k / selected part) + the new entry written, the
    # block's input read and output written.
    io = 2 * cfg.dim * dt.nbytes("act")
    read = block_decode_read(b, cfg, L, dt)
    nbytes = params * dt.nbytes("act") / opt.batch + 2 * state + read + (kv - kv_prev) + io
    inten = fd / nbytes if nbytes else 0.0
    return BlockRow(
        id=b.id,
        kind="+".join(m.type for m in b.mixers),
        label=next((m.label for m in b.mixers if m.label), None),
        options="; ".join(filter(None, (options_text(m, cfg) for m in b.mixers))),
        iterations=it,
        params_stored=params,
        params_executed=params * it,
        flops_prefill=fp,
        flops_decode=fd,
        flops_mixer_prefill=cp,
        flops_mixer_decode=cd,
        decode_bytes=nbytes,
        intensity=inten,
        bound="compute" if inten >= opt.hw.ridge(dt.act) else "memory",
        state_bytes=state,
        kv_bytes=kv,
    )


def _extra_rows(model: n.Model, L: int, opt: EstimateOptions, dt: Dtypes) -> list[BlockRow]:
    cfg = model.config
    D, V = cfg.dim, cfg.vocab
    rows = [_simple_row("embed", "embedding", V * D, 1, 0.0, D * dt.nbytes("act"), opt, dt)]
    head_params = V * D if (cfg.head and not cfg.tie_embeddings) else 0
    norm = sum(math.prod(s) for s in norm_weights(cfg.norm, D).values())
    head_flops = 2.0 * D * V if cfg.head else 0.0
    head_bytes = (V * D * dt.nbytes("act") / opt.batch if cfg.head else 0.0) + V * 4
    head = _simple_row(
        "head", "norm+lm_head" if cfg.head else "norm", head_params + norm, 1, head_flops, head_bytes, opt, dt
    )
    # The final norm's weights are stored once but run after every iteration of a
    # `final_norm=true` loop (`final_norm_applications`).
    executed = head_params + norm * final_norm_applications(model.body)
    rows.append(head.model_copy(update={"params_executed": executed}))
    its = _loop_iterations(model.body)
    for lp in _loops(model.body):
        if lp.inject == "concat":
            # The embedding is re-injected before every iteration after the first: T − 1 times.
            adapter_its = its[lp.id] // lp.T * (lp.T - 1)
            rows.append(
                _simple_row(
                    f"{lp.id}.adapter",
                    "inject=concat",
                    2 * D * D,
                    adapter_its,
                    4.0 * D * D,
                    2 * D * D * dt.nbytes("act") / opt.batch,
                    opt,
                    dt,
                )
            )
        if lp.exit is not None:
            rows.append(
                _simple_row(
                    f"{lp.id}.exit",
                    "exit=gate",
                    D + 1,
                    its[lp.id],
                    2.0 * D,
                    D * dt.nbytes("act") / opt.batch,
                    opt,
                    dt,
                )
            )
    return rows


def _simple_row(id_, kind, params, it, flops, nbytes, opt, dt) -> BlockRow:
    inten = flops / nbytes if nbytes else 0.0
    return BlockRow(
        id=id_,
        kind=kind,
        options="",
        iterations=it,
        params_stored=params,
        params_executed=params * it,
        flops_prefill=flops,
        flops_decode=flops,
        flops_mixer_prefill=0.0,
        flops_mixer_decode=0.0,
        decode_bytes=nbytes,
        intensity=inten,
        bound="compute" if inten >= opt.hw.ridge(dt.act) else "memory",
        state_bytes=0,
        kv_bytes=0,
    )


def _expand(rows: list[BlockRow], model: n.Model) -> list[BlockRow]:
    """One row per (iteration, block): ids prefixed with the iteration index `it<k>/`."""
    out = []
    for r in rows:
        if r.iterations == 1:
            out.append(r)
            continue
        for k in range(r.iterations):
            out.append(
                r.model_copy(
                    update={
                        "id": f"it{k}/{r.id}",
                        "iterations": 1,
                        "params_stored": r.params_stored if k == 0 else 0,
                        "params_executed": r.params_stored,
                    }
                )
            )
    return out


def _train_activations(model: n.Model, L: int, batch: int, dt: Dtypes) -> dict[str, int]:
    cfg = model.config
    b = dt.nbytes("act")
    per_app = [block_activations(blk, cfg) * it for blk, it in iter_blocks(model.body)]
    apps = sum(it for _, it in iter_blocks(model.body))
    largest = max((block_activations(blk, cfg) for blk, _ in iter_blocks(model.body)), default=0)
    kept = sum(block_kept(blk, cfg) * it for blk, it in iter_blocks(model.body))
    logits = batch * L * cfg.vocab * 4 if cfg.head else 0  # fp32 logits for the loss
    full = batch * L * sum(per_app) * b + logits
    # the trainer's default checkpointing keeps each application's attention outputs
    recompute = batch * L * (apps * cfg.dim + kept + largest) * b + logits
    return {"train_activations_bytes": full, "train_activations_recompute_bytes": recompute}


def prefill_gather_bytes(model: n.Model, L: int, dt: Dtypes) -> float:
    """Bytes of cached k/v the queries of a prefill of L tokens gather one by one, per token: the
    mixers' `prefill_gather` × applications, in the kv dtype."""
    cfg = model.config
    blocks = iter_blocks(model.body)
    elems = sum(lookup(m.type).prefill_gather(m.opts, cfg, L) * it for b, it in blocks for m in b.mixers)
    return elems * dt.nbytes("kv")


def _roofline(model, rows, extras, L, opt, dt, prefill, decode, cache) -> Roofline:
    hw, B = opt.hw, opt.batch
    peak, bw = hw.peak(dt.act), hw.hbm_bytes_per_s
    executed_w = sum(r.params_executed for r in rows + extras) * dt.nbytes("act")
    acts = B * L * sum(4 * model.config.dim * r.iterations for r in rows) * dt.nbytes("act")
    p_bytes = executed_w + acts + cache + B * L * prefill_gather_bytes(model, L, dt)
    p_time = max(B * L * prefill / peak, p_bytes / bw)
    step_bytes = sum(r.decode_bytes * r.iterations for r in rows + extras) * B
    kernels = decode_kernels(model, B, L)
    launch = kernels * hw.kernel_s
    d_roof = max(B * decode / peak, step_bytes / bw)
    d_time = d_roof + launch
    gen = p_time + _generate_time(model, L, opt, dt) if opt.gen else None
    bound = "compute" if B * decode / peak >= step_bytes / bw else "memory"
    return Roofline(
        prefill_tokens_per_s=B * L / p_time,
        decode_tokens_per_s=B / d_time,
        ttft_s=p_time,
        prefill_bound="compute" if B * L * prefill / peak >= p_bytes / bw else "memory",
        decode_bound="launch" if launch > d_roof else bound,
        decode_step_s=d_time,
        decode_bytes_per_step=step_bytes,
        decode_kernels=kernels,
        decode_launch_s=launch,
        generate_s=gen,
    )


def _step_time(model: n.Model, ctx: int, opt: EstimateOptions, dt: Dtypes) -> float:
    """Roofline time of one decode step for the batch at context `ctx`, its kernels' fixed cost
    included."""
    cfg, B = model.config, opt.batch
    rows = [_row(b, it, cfg, ctx, opt, dt) for b, it in iter_blocks(model.body)]
    every = rows + _extra_rows(model, ctx, opt, dt)
    flops = sum(r.flops_decode * r.iterations for r in every) * B
    nbytes = sum(r.decode_bytes * r.iterations for r in every) * B
    launch = decode_kernels(model, B, ctx) * opt.hw.kernel_s
    return max(flops / opt.hw.peak(dt.act), nbytes / opt.hw.hbm_bytes_per_s) + launch


# Kernels of every decode step outside the blocks and norms: the embedding, the head's GEMM,
# greedy sampling and the stop test (argmax, where, eq, any, an in-place or, the token's copy and
# its write into the output), the two counters' advance.
STEP_KERNELS = 11
# An exit-gated loop's decode: one gate GEMM per iteration, and once the exit distribution, the
# chosen iteration and its output gathered (sigmoid, cumulative products and sums, argmax, ...);
# without a final norm per iteration the gate also unfuses the last residual add from its norm.
EXIT_KERNELS = 16


def decode_kernels(model: n.Model, batch: int, L: int) -> int:
    """Kernels one decode step of lt2dsl's engine launches at context L for `batch` rows (the CUDA
    graph `generate` replays, greedy): every block application's (`block_decode_kernels` and its
    mixers' `decode_kernels`), the work done once a step (`decode_once`, by key), the loops'
    (a final norm after each iteration, the injected input: one add, or concatenation, its
    projection and a norm), and the step's own (`STEP_KERNELS`). A GEMM counts once however
    cuBLAS runs it (a split-K product is two kernels on the card)."""
    cfg = model.config
    once: dict[tuple, int] = {}
    # one norm with no add before it: the first block's pre-norm (layernorm: the final norm), and
    # a loop's final norm after each iteration but the model's last
    total = STEP_KERNELS + lone_norm_kernels(cfg.norm) * final_norm_applications(model.body)
    for b, it in iter_blocks(model.body):
        per = block_decode_kernels(b.norm, b.mlp)
        for m in b.mixers:
            spec = lookup(m.type)
            per += spec.decode_kernels(m.opts, cfg, batch, L)
            once |= spec.decode_once(m.opts, cfg)
        total += per * it
    total += sum(once.values())
    return total + _loop_kernels(model.body, 1)


def _loop_kernels(stages, around: int) -> int:
    """The loops' own decode kernels, each loop's times the T of the loops around it: the injected
    input after every iteration but the first (one add, or a concatenation, its projection and a
    norm) and an exit gate's."""
    total = 0
    for s in stages:
        if isinstance(s, n.LoopBlock):
            total += (s.T - 1) * {"none": 0, "add": 1, "concat": 3}[s.inject] * around
            if s.exit:
                total += (EXIT_KERNELS + s.T + (not s.final_norm)) * around
            total += _loop_kernels(s.body, around * s.T)
    return total


def _generate_time(model: n.Model, L: int, opt: EstimateOptions, dt: Dtypes) -> float:
    """G decode steps at contexts L+1 … L+G by the trapezoid rule: a step's time is piecewise affine
    in the context (affine while one bound holds, capped by windows), so the sum is exact when
    nothing switches inside [L+1, L+G] and close when something does."""
    G = opt.gen
    return G * (_step_time(model, L + 1, opt, dt) + _step_time(model, L + G, opt, dt)) / 2


def _capacity(model: n.Model, L: int, opt: EstimateOptions, dt: Dtypes, weights: int) -> Capacity:
    free = opt.hw.memory_bytes - weights
    per_seq = _cache_bytes(model, 1, L, dt)
    max_batch = int(free // per_seq) if per_seq else 0
    if free <= 0:
        return Capacity(max_batch=0, max_len=0, max_len_note="the weights alone do not fit")
    grows = _cache_bytes(model, 1, 2 * L, dt) > per_seq
    if not grows:
        return Capacity(max_batch=max_batch, max_len=None, max_len_note="no cache grows with L")
    lo, hi = 0, 1
    while _cache_bytes(model, opt.batch, hi, dt) <= free and hi < 2**40:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _cache_bytes(model, opt.batch, mid, dt) <= free else (lo, mid)
    cap = _tmm_cap(model)
    note = f"tmm caps the context at max_len={cap}" if cap is not None and cap < lo else ""
    return Capacity(max_batch=max_batch, max_len=min(lo, cap) if cap else lo, max_len_note=note)


def _cache_bytes(model: n.Model, batch: int, L: int, dt: Dtypes) -> int:
    total = 0
    for b, it in iter_blocks(model.body):
        s, k = block_cache(b, model.config, batch, L, dt)
        total += (s + k) * it
    return total


def _tmm_cap(model: n.Model) -> int | None:
    caps = [m.opts["max_len"] for b, _ in iter_blocks(model.body) for m in b.mixers if m.type == "tmm"]
    return min(caps) if caps else None


def _theory(model: n.Model) -> Theory:
    depth = sum(it for _, it in iter_blocks(model.body))
    look: int | None = 0
    rank = None
    for b, it in iter_blocks(model.body):
        for m in b.mixers:
            spec = lookup(m.type)
            w = spec.window(m.opts)
            look = None if (look is None or w is None) else look + w * it
            if spec.is_delta_rule():
                rank = max(rank or 0, it)
    return Theory(effective_depth=depth, receptive_field=None if look is None else look + 1, update_rank=rank)


def _expected_decode(model, rows, extras, opt: EstimateOptions) -> float | None:
    """Decode FLOPs per token when gated loops stop early, from `--exit-profile`
    (probabilities of exiting after iteration 1, 2, …; normalized)."""
    if not opt.exit_profile or not any(lp.exit for lp in _loops(model.body)):
        return None
    p = [max(x, 0.0) for x in opt.exit_profile]
    s = sum(p) or 1.0
    expected = sum((i + 1) * x / s for i, x in enumerate(p))
    gated = {lp.id: lp for lp in _loops(model.body) if lp.exit}
    total = 0.0
    for r in rows + extras:
        scale = expected / gated[g].T if (g := _enclosing(r.id, gated)) else 1.0
        total += r.flops_decode * r.iterations * scale
    return total


def _enclosing(row_id: str, gated: dict) -> str | None:
    return next((g for g in gated if row_id.startswith(g + "/") or row_id.startswith(g + ".")), None)


def conventions(opt: EstimateOptions) -> list[str]:
    causal = (
        "causal attention counts only unmasked keys (exact triangle: a prefill of L averages "
        "(L+1)/2 keys per query)"
        if opt.causal == "exact"
        else "causal attention counts the whole L×L square (--causal full, as nanoGPT and "
        "torch's FlopCounterMode do)"
    )
    hw = opt.hw
    return [
        "a multiply-add counts as 2 FLOPs; elementwise work (norms, activations, gates) is not counted",
        causal,
        "training = forward + backward; backward = 2 × forward unless a mixer's spec says otherwise",
        "looped blocks count executed FLOPs (T × per iteration); parameters count once",
        "chunked mixers are counted at chunk C = 64 (C = L for a prefill shorter than one chunk)",
        "decode step at context L: the new token sees L keys; caches are measured after L tokens",
        "prefill bytes: executed weights + block inputs and outputs + the cache written + the k/v a "
        "token-level selection gathers per query (dsa: its top-k, nsa: its selected blocks)",
        "decode bytes per token: executed weights / batch + state read and write + the KV the step "
        "reads (dsa: every index key, top-k k/v; nsa: compressed, selected and window k/v) and the "
        "new KV entry + block input and output",
        "caches are per (iteration, block): states in state_dtype, KV in kv_dtype, conv buffers and "
        "tmm inputs in dtype",
        f"roofline on {hw.name}: time = max(FLOPs / {hw.peak_flops['bf16'] / 1e12:.0f} TFLOP/s, "
        f"bytes / {hw.hbm_bytes_per_s / 1e12:.2f} TB/s)"
        + (f" + decode kernels × {hw.kernel_s * 1e6:.2f} µs" if hw.kernel_s else "")
        + f" ({hw.source})",
        "decode kernels: the launches of one step of lt2dsl's engine (a GEMM counts once; "
        "cuBLAS's split-K reduce kernels are not counted)",
    ]
