"""Independent references for checkpoints the CPU cannot run with their own code: Ouro's forward
and fla's models, written from their public modeling code over a state dict under *their* names.

They use no lt2dsl code: plain PyTorch attention (SDPA), RoPE with `rotate_half`, and the linear
recurrences written step by step (fla's `naive_recurrent_*` semantics), so a mapping or option
mistake of the importer shows up as a logits mismatch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms(x, w, eps, offset=False):
    """RMSNorm in fp32, returned in x's dtype (HF's: the weight scales the rounded normed input)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1 + w.float())).to(x.dtype) if offset else w * y.to(x.dtype)


def rope(x, theta):
    """x `[B, T, H, d]`, half-split (rotate_half) RoPE at positions 0..T-1."""
    T, d = x.shape[1], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[None, :, None], torch.cat([ang.sin()] * 2, -1)[None, :, None]
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return (x * cos.to(x.device) + rot * sin.to(x.device)).to(x.dtype)


def attention(sd, p, x, H, KV, d, theta, window=None, bias=False):
    """Causal GQA softmax attention with RoPE (Llama / Ouro / fla `Attention`); `window` keys incl. self."""
    B, T, _ = x.shape

    def proj(n, heads):
        y = x @ sd[f"{p}{n}_proj.weight"].T
        if bias:
            y = y + sd[f"{p}{n}_proj.bias"]
        return y.view(B, T, heads, d)

    q, k, v = rope(proj("q", H), theta), rope(proj("k", KV), theta), proj("v", KV)
    i = torch.arange(T, device=x.device)
    mask = i[None, :] <= i[:, None]
    if window:
        mask &= i[None, :] > i[:, None] - window
    k, v = (t.repeat_interleave(H // KV, 2) for t in (k, v))
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    )
    return o.transpose(1, 2).reshape(B, T, H * d) @ sd[f"{p}o_proj.weight"].T


def swiglu(sd, p, x):
    return (F.silu(x @ sd[f"{p}gate_proj.weight"].T) * (x @ sd[f"{p}up_proj.weight"].T)) @ sd[
        f"{p}down_proj.weight"
    ].T


def ouro_logits(sd, cfg, ids):
    """Ouro (ByteDance `modeling_ouro.py`): sandwich blocks looped `total_ut_steps` times, the final
    norm after each, the exit gate picking each token's step at `early_exit_threshold`."""
    eps, L = cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg["hidden_size"] // H
    h = sd["model.embed_tokens.weight"][ids]
    hs, gates = [], []
    for _ in range(cfg["total_ut_steps"]):
        for i in range(L):
            p = f"model.layers.{i}."
            a = attention(
                sd,
                p + "self_attn.",
                rms(h, sd[p + "input_layernorm.weight"], eps),
                H,
                KV,
                d,
                cfg["rope_theta"],
            )
            h = h + rms(a, sd[p + "input_layernorm_2.weight"], eps)
            m = swiglu(sd, p + "mlp.", rms(h, sd[p + "post_attention_layernorm.weight"], eps))
            h = h + rms(m, sd[p + "post_attention_layernorm_2.weight"], eps)
        h = rms(h, sd["model.norm.weight"], eps)
        hs.append(h)
        gates.append(h @ sd["model.early_exit_gate.weight"].T + sd["model.early_exit_gate.bias"])
    lam = torch.sigmoid(torch.cat(gates, -1))  # [B, T, steps]
    left, pdf = torch.ones_like(lam[..., 0]), []
    for s in range(lam.shape[-1]):
        pdf.append(lam[..., s] * left if s < lam.shape[-1] - 1 else left)
        left = left * (1 - lam[..., s])
    reached = torch.cumsum(torch.stack(pdf, -1), -1) >= cfg["early_exit_threshold"]
    step = torch.where(reached.any(-1), reached.float().argmax(-1), lam.shape[-1] - 1)
    h = torch.stack(hs, 2).gather(2, step[..., None, None].expand(-1, -1, 1, h.shape[-1])).squeeze(2)
    return h @ sd["lm_head.weight"].T


# ---- fla ------------------------------------------------------------------------------------------


def short_conv(sd, name, x):
    """fla `ShortConvolution` (causal depthwise conv, no bias) + SiLU; x `[B, T, C]`."""
    w = sd[name]
    y = F.conv1d(F.pad(x.transpose(1, 2), (w.shape[-1] - 1, 0)), w, groups=w.shape[0])
    return F.silu(y.transpose(1, 2))


def l2(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def recurrence(q, k, v, g=None, beta=None):
    """S_t = diag(e^{g_t}) S_{t-1} (+ delta-rule or plain write), o_t = S_tᵀ q_t (q pre-scaled).

    q, k `[B, T, H, K]`, v `[B, T, H, V]`, g `[B, T, H, K]` or `[B, T, H]` (log decay) or None,
    beta `[B, T, H]` (delta rule) or None (plain linear attention)."""
    B, T, H, K = k.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for t in range(T):
        if g is not None:
            gt = g[:, t] if g.dim() == 4 else g[:, t, :, None]
            S = S * gt.exp()[..., None]
        if beta is None:
            S = S + k[:, t, :, :, None] * v[:, t, :, None, :]
        else:
            u = (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)) * beta[:, t, :, None]
            S = S + k[:, t, :, :, None] * u[:, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, 1)


def gated_norm(o, w, eps, g=None, act=F.silu):
    y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * w
    return y if g is None else y * act(g)


def fla_mixer(sd, p, x, kind, cfg):
    """The non-attention mixer of an fla block (`fla/layers/{gated_deltanet,delta_net,kda,gla}.py`)."""
    B, T, _ = x.shape
    H, eps = cfg["num_heads"], cfg.get("norm_eps", 1e-6)

    def heads(y, n):
        return y.view(B, T, n, -1)

    if kind == "gla":  # k, v, decay for num_kv_heads heads, repeated `(h d) -> (h g) d` (fla)
        KV = cfg.get("num_kv_heads") or H

        def shared(y):
            return heads(y, KV).repeat_interleave(H // KV, 2)

        q, k = heads(x @ sd[p + "q_proj.weight"].T, H), shared(x @ sd[p + "k_proj.weight"].T)
        v = shared(x @ sd[p + "v_proj.weight"].T)
        gk = (x @ sd[p + "gk_proj.0.weight"].T) @ sd[p + "gk_proj.1.weight"].T + sd[p + "gk_proj.1.bias"]
        g = F.logsigmoid(shared(gk)) / 16
        o = recurrence(q * q.shape[-1] ** -0.5, k, v, g)
        o = gated_norm(o, sd[p + "g_norm_swish_gate.weight"], eps, heads(x @ sd[p + "g_proj.weight"].T, H))
        return o.reshape(B, T, -1) @ sd[p + "o_proj.weight"].T
    q = heads(short_conv(sd, p + "q_conv1d.weight", x @ sd[p + "q_proj.weight"].T), H)
    k = heads(short_conv(sd, p + "k_conv1d.weight", x @ sd[p + "k_proj.weight"].T), H)
    v = heads(short_conv(sd, p + "v_conv1d.weight", x @ sd[p + "v_proj.weight"].T), H)
    q, k = l2(q) * q.shape[-1] ** -0.5, l2(k)
    beta = torch.sigmoid(x @ sd[p + "b_proj.weight"].T)
    g, gate, act = None, None, F.silu
    if kind == "gdn":
        g = -sd[p + "A_log"].exp() * F.softplus(x @ sd[p + "a_proj.weight"].T + sd[p + "dt_bias"])
        gate = heads(x @ sd[p + "g_proj.weight"].T, H)
    elif kind == "kda":
        f = (x @ sd[p + "f_proj.0.weight"].T) @ sd[p + "f_proj.1.weight"].T
        g = -sd[p + "A_log"].exp()[:, None] * F.softplus(heads(f, H) + sd[p + "dt_bias"].view(H, -1))
        gl = (x @ sd[p + "g_proj.0.weight"].T) @ sd[p + "g_proj.1.weight"].T + sd[p + "g_proj.1.bias"]
        gate, act = heads(gl, H), torch.sigmoid
    o = gated_norm(recurrence(q, k, v, g, beta), sd[p + "o_norm.weight"], eps, gate, act)
    return o.reshape(B, T, -1) @ sd[p + "o_proj.weight"].T


def fla_logits(sd, cfg, ids, kind):
    """An fla model (`fla/models/*/modeling_*.py`): pre-norm blocks, `attn` layers softmax attention."""
    eps = cfg.get("norm_eps", 1e-6)
    attn = cfg.get("attn") or {"layers": []}
    h = sd["model.embeddings.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, sd[p + "attn_norm.weight"], eps)
        if i in attn["layers"]:
            H = attn["num_heads"]
            KV = attn.get("num_kv_heads") or H
            d = cfg["hidden_size"] // H
            y = attention(
                sd, p + "attn.", x, H, KV, d, attn.get("rope_theta", 10000.0), attn.get("window_size")
            )
        else:
            y = fla_mixer(sd, p + "attn.", x, kind, cfg)
        h = h + y
        h = h + swiglu(sd, p + "mlp.", rms(h, sd[p + "mlp_norm.weight"], eps))
    h = rms(h, sd["model.norm.weight"], eps)
    head = sd["model.embeddings.weight"] if cfg.get("tie_word_embeddings") else sd["lm_head.weight"]
    return h @ head.T
