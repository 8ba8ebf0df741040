"""Torch twins of every kernel: the oracle in tests and the engine's CPU path.

Each function here has exactly the signature of the Triton kernel that replaces it on CUDA
(``catengine.kernels.ops`` picks one or the other). Shapes use: T new tokens in the flat batch,
B sequences, H hidden size, nh/nkv attention heads, d head dim, Hk/Hv linear-attention key/value
heads, dk/dv their head dims, C conv channels, Kc conv kernel, V vocabulary, E experts.
Unless said otherwise, outputs have the dtype of the main input and math is done in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .packing import QuantizedWeight, dequantize


# ---------------------------------------------------------------- norms and activations
def rms_norm(x, weight, eps: float, residual=None):
    """Qwen's (1 + w) RMSNorm over the last dim.

    x: [T, H]; weight: [H] (stored as w, the kernel adds 1); residual: optional [T, H].
    Without residual returns ``y``. With residual it first forms ``s = x + residual`` (in x.dtype,
    as the model's residual stream is kept) and returns ``(rmsnorm(s), s)``.
    """
    s = x if residual is None else x + residual
    xf = s.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    y = y.to(x.dtype)
    return y if residual is None else (y, s)


def gated_rms_norm(x, z, weight, eps: float):
    """GDN output norm: ``weight * rmsnorm(x) * silu(z)`` (plain w, not 1 + w), per head.

    x, z: [T, Hv, dv]; weight: [dv]. Returns [T, Hv, dv] in x.dtype.
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y.to(x.dtype).float() * weight.float() * F.silu(z.float())
    return y.to(x.dtype)


def silu_mul(x):
    """x: [T, 2I] holding [gate | up] -> silu(gate) * up: [T, I]."""
    gate, up = x.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(x.dtype)


# ---------------------------------------------------------------- rotary embedding
def rope_cos_sin_cache(max_positions: int, rotary_dim: int, theta: float, device=None):
    """[max_positions, rotary_dim] fp32: columns [0, rotary_dim/2) are cos, the rest sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim))
    pos = torch.arange(max_positions, dtype=torch.float32, device=device)
    freqs = pos[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _neox_rope(x, cos, sin):
    """x: [T, heads, d]; cos/sin: [T, rot/2]. Rotates the first rot dims (rotate-half layout)."""
    rot = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :rot].float(), x[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
    return torch.cat([out, x_pass], dim=-1)


def qk_norm_rope(q, k, q_weight, k_weight, positions, cos_sin_cache, eps: float):
    """Per-head (1 + w) RMSNorm of q and k, then partial NeoX RoPE on the first rotary dims.

    q: [T, nh, d]; k: [T, nkv, d]; q_weight, k_weight: [d]; positions: [T] int64;
    cos_sin_cache: [max_pos, rot] from :func:`rope_cos_sin_cache`. Returns new (q, k).
    """
    half = cos_sin_cache.shape[-1] // 2
    cs = cos_sin_cache[positions]
    cos, sin = cs[:, :half], cs[:, half:]
    qn = rms_norm(q, q_weight, eps)
    kn = rms_norm(k, k_weight, eps)
    return _neox_rope(qn, cos, sin), _neox_rope(kn, cos, sin)


# ---------------------------------------------------------------- fp8 e5m2 KV bytes
def fp16_to_e5m2(x):
    """fp16 -> fp8 e5m2 as uint8, round to nearest even, no saturation (overflow -> inf),
    NaN -> 0x7F/0xFF by sign: bit-exact with ``x.to(torch.float8_e5m2)``. Integer ops only, as the
    sm_70 kernel must do (SM70.md)."""
    bits = x.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    mag = bits & 0x7FFF
    rounded = (bits + 0x7F + ((bits >> 8) & 1)) >> 8
    nan = (bits & 0x8000) >> 8 | 0x7F
    return torch.where(mag > 0x7C00, nan, rounded & 0xFF).to(torch.uint8)


def e5m2_to_fp16(b):
    """uint8 e5m2 bytes -> fp16 (exact: e5m2 is the top byte of an fp16)."""
    return (b.to(torch.int32) << 8).to(torch.int16).view(torch.float16)


def _to_cache(x, cache_dtype):
    return fp16_to_e5m2(x) if cache_dtype == torch.uint8 else x.to(cache_dtype)


def _from_cache(x, dtype):
    return e5m2_to_fp16(x).to(dtype) if x.dtype == torch.uint8 else x.to(dtype)


# ---------------------------------------------------------------- paged KV cache and attention
def store_kv(key, value, k_cache, v_cache, slot_mapping):
    """Scatter new K/V into the paged cache (in place).

    key, value: [T, nkv, d]; k_cache, v_cache: [num_blocks, block_size, nkv, d] of the model dtype,
    or uint8 holding fp8 e5m2 bytes; slot_mapping: [T] int64, slot = block * block_size + offset,
    negative = skip this token (padding).
    """
    nb, bs = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(nb * bs, *k_cache.shape[2:])[slots] = _to_cache(key[keep], k_cache.dtype)
    v_cache.view(nb * bs, *v_cache.shape[2:])[slots] = _to_cache(value[keep], v_cache.dtype)


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale: float,
                    max_query_len: int, max_seq_len: int, gate=None):
    """Causal GQA attention of new tokens over their sequence's whole cached context.

    q: [T, nh, d]; caches as in :func:`store_kv` (already holding the new tokens' K/V);
    block_tables: [B, max_blocks] int32; seq_lens: [B] int32 (cached + new); query_start_loc: [B+1]
    int32. Sequence b's queries are the last ``q_len_b`` positions of its ``seq_len_b`` tokens.
    max_query_len / max_seq_len are host-side upper bounds (launch sizing; the twin ignores them).
    gate: optional [T, nh, d]; if given the output is multiplied by sigmoid(gate).
    Decode is the case q_len = 1 for every sequence. Returns [T, nh, d] in q.dtype.
    """
    out = torch.empty_like(q)
    nh, nkv = q.shape[1], k_cache.shape[2]
    bs = k_cache.shape[1]
    qsl, sl = query_start_loc.tolist(), seq_lens.tolist()
    for b in range(len(sl)):
        start, end, n = qsl[b], qsl[b + 1], sl[b]
        if end == start:
            continue
        nblk = (n + bs - 1) // bs
        blocks = block_tables[b, :nblk].long()
        k = _from_cache(k_cache[blocks].reshape(-1, nkv, k_cache.shape[-1])[:n], torch.float32)
        v = _from_cache(v_cache[blocks].reshape(-1, nkv, v_cache.shape[-1])[:n], torch.float32)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        qb = q[start:end].float()
        s = torch.einsum("qhd,khd->hqk", qb, k) * scale
        q_pos = torch.arange(n - (end - start), n, device=q.device)
        mask = torch.arange(n, device=q.device)[None, :] > q_pos[:, None]
        s = s.masked_fill(mask[None], float("-inf"))
        o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
        if gate is not None:
            o = o * torch.sigmoid(gate[start:end].float())
        out[start:end] = o.to(q.dtype)
    return out


# ---------------------------------------------------------------- causal conv1d (GDN)
def causal_conv1d(x, weight, conv_states, query_start_loc, state_slots, has_initial_state,
                  activation: str | None = "silu"):
    """Depthwise causal conv over each sequence of a varlen batch, continuing from a saved state.

    x: [T, C]; weight: [C, Kc]; conv_states: [num_slots, Kc-1, C] (the last Kc-1 *pre-conv* inputs,
    oldest first), read from ``state_slots[b]`` when ``has_initial_state[b]`` (else zeros) and
    overwritten with the sequence's new last Kc-1 inputs. Returns silu(conv(x)) [T, C] in x.dtype.
    """
    out = torch.empty_like(x)
    kc = weight.shape[1]
    qsl = query_start_loc.tolist()
    for b in range(len(qsl) - 1):
        start, end = qsl[b], qsl[b + 1]
        if end == start:
            continue
        slot = int(state_slots[b])
        init = conv_states[slot] if bool(has_initial_state[b]) else torch.zeros_like(conv_states[slot])
        seq = torch.cat([init.to(torch.float32), x[start:end].float()], dim=0)  # [Kc-1+L, C]
        y = F.conv1d(seq.t()[None], weight.float()[:, None, :], groups=weight.shape[0])[0].t()
        if activation == "silu":
            y = F.silu(y)
        out[start:end] = y.to(x.dtype)
        conv_states[slot] = seq[-(kc - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_update(x, weight, conv_states, state_slots, activation: str | None = "silu"):
    """Decode form: one new token per sequence. x: [B, C]; the rest as in :func:`causal_conv1d`
    (every sequence has a state)."""
    b = x.shape[0]
    qsl = torch.arange(b + 1, dtype=torch.int32, device=x.device)
    has = torch.ones(b, dtype=torch.bool, device=x.device)
    return causal_conv1d(x, weight, conv_states, qsl, state_slots, has, activation)


# ---------------------------------------------------------------- gated delta rule (GDN)
def gdn_gating(A_log, a, dt_bias, b):
    """g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b), both fp32 [T, Hv].
    A_log, dt_bias: [Hv]; a, b: [T, Hv]."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def _l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _gdn_prepare(q, k, v, g, beta, scale, use_qk_l2norm):
    """Per-token fp32 tensors with key heads expanded to value heads: q, k [L, Hv, dk]."""
    rep = v.shape[1] // q.shape[1]
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * scale
    return q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1), v.float(), g.float(), beta.float()


def _initial_state(ssm_states, slot, has_init):
    return ssm_states[slot].float().clone() if has_init else torch.zeros_like(ssm_states[slot], dtype=torch.float32)


def chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                           has_initial_state, scale: float, use_qk_l2norm: bool = True,
                           chunk_size: int = 64):
    """Gated delta rule over a varlen batch in the chunked (UT-transform) form.

    q, k: [T, Hk, dk]; v: [T, Hv, dv] (value head h uses key head h // (Hv // Hk)); g (log decay,
    <= 0), beta: [T, Hv] fp32; ssm_states: [num_slots, Hv, dk, dv] fp32, read from state_slots[b]
    when has_initial_state[b] (else zeros) and overwritten with the final state.
    Per token: S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q, with q, k l2-normalised when
    ``use_qk_l2norm`` and q scaled by ``scale``. Returns o: [T, Hv, dv] in v.dtype.
    """
    out = torch.empty_like(v)
    qsl = query_start_loc.tolist()
    tri = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(0)
    for b in range(len(qsl) - 1):
        s0, s1 = qsl[b], qsl[b + 1]
        if s1 == s0:
            continue
        slot = int(state_slots[b])
        S = _initial_state(ssm_states, slot, bool(has_initial_state[b]))  # [Hv, dk, dv]
        qb, kb, vb, gb, bb = _gdn_prepare(q[s0:s1], k[s0:s1], v[s0:s1], g[s0:s1], beta[s0:s1],
                                          scale, use_qk_l2norm)
        for c0 in range(0, s1 - s0, chunk_size):
            c1 = min(c0 + chunk_size, s1 - s0)
            n = c1 - c0
            # [Hv, n, *] views of this chunk
            qc, kc, vc = (t[c0:c1].transpose(0, 1) for t in (qb, kb, vb))
            gc = gb[c0:c1].t().cumsum(-1)  # [Hv, n] cumulative log decay
            bc = bb[c0:c1].t()
            decay = (gc[:, :, None] - gc[:, None, :]).masked_fill(tri[:n, :n], float("-inf")).exp()
            # A = I + strictly-lower(beta_i k_i.k_j decay_ij); solve A [u | w] = beta [v | k exp(gc)]
            a = torch.eye(n, device=q.device) + (bc[:, :, None] * (kc @ kc.transpose(1, 2))) * decay
            rhs = torch.cat([vc, kc * gc.exp()[:, :, None]], dim=-1) * bc[:, :, None]
            uw = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
            u, w = uw[..., : vc.shape[-1]], uw[..., vc.shape[-1]:]
            v_new = u - w @ S  # [Hv, n, dv]
            attn = (qc @ kc.transpose(1, 2)) * (gc[:, :, None] - gc[:, None, :]).exp().tril()
            o = (qc * gc.exp()[:, :, None]) @ S + attn @ v_new
            out[s0 + c0:s0 + c1] = o.transpose(0, 1).to(v.dtype)
            g_last = gc[:, -1:]
            S = S * g_last.exp()[:, :, None] + (kc * (g_last - gc).exp()[:, :, None]).transpose(1, 2) @ v_new
        ssm_states[slot] = S.to(ssm_states.dtype)
    return out


def recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots,
                               has_initial_state, scale: float, use_qk_l2norm: bool = True,
                               intermediate_state_slots=None):
    """Token-by-token form of :func:`chunk_gated_delta_rule` (same arguments), for decode and for a
    few tokens per sequence (speculative verification).

    intermediate_state_slots: optional [B, max_query_len] int32; when given, the state after the
    sequence's j-th new token is also written to slot ``intermediate_state_slots[b, j]`` (so a
    rejected draft can roll back); negative entries are skipped. The final state always goes to
    ``state_slots[b]``.
    """
    out = torch.empty_like(v)
    qsl = query_start_loc.tolist()
    for b in range(len(qsl) - 1):
        s0, s1 = qsl[b], qsl[b + 1]
        if s1 == s0:
            continue
        slot = int(state_slots[b])
        S = _initial_state(ssm_states, slot, bool(has_initial_state[b]))
        qb, kb, vb, gb, bb = _gdn_prepare(q[s0:s1], k[s0:s1], v[s0:s1], g[s0:s1], beta[s0:s1],
                                          scale, use_qk_l2norm)
        for t in range(s1 - s0):
            S = S * gb[t].exp()[:, None, None]
            delta = bb[t][:, None] * (vb[t] - (S * kb[t][:, :, None]).sum(1))  # [Hv, dv]
            S = S + kb[t][:, :, None] * delta[:, None, :]
            out[s0 + t] = (S * qb[t][:, :, None]).sum(1).to(v.dtype)
            if intermediate_state_slots is not None and int(intermediate_state_slots[b, t]) >= 0:
                ssm_states[int(intermediate_state_slots[b, t])] = S.to(ssm_states.dtype)
        ssm_states[slot] = S.to(ssm_states.dtype)
    return out


# ---------------------------------------------------------------- linear layers and MoE
def w4a16_linear(x, weight: QuantizedWeight, bias=None):
    """x: [M, K] @ dequantized weight [K, N] (+ bias [N]) -> [M, N] in x.dtype, fp32 accumulation.
    See :mod:`catengine.kernels.packing` for the weight layout."""
    y = x.float() @ dequantize(weight, torch.float32)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w4a16_dequantize(weight: QuantizedWeight, dtype=None):
    """The dense [K, N] weight (x @ w layout) in ``dtype`` (default the scales' dtype): (q - z) * s in
    fp32, rounded once. Twin of the dequantise kernel behind large-M ``w4a16_linear`` on CUDA."""
    return dequantize(weight, dtype)


def moe_route(router_logits, top_k: int, renormalize: bool = True):
    """Softmax over all experts in fp32, top-k, optional renormalisation of the chosen weights.
    router_logits: [T, E] -> (topk_weights fp32 [T, k], topk_ids int32 [T, k])."""
    probs = router_logits.float().softmax(-1)
    w, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, ids.to(torch.int32)


def _expert_matrix(w, e: int, dtype):
    """Expert e's weight in x @ W layout [in, out]: dense experts are stored torch-style [out, in]."""
    if isinstance(w, QuantizedWeight):
        return dequantize(QuantizedWeight(w.qweight[e], w.scales[e], w.zeros[e], w.group_size), dtype)
    return w[e].to(dtype).t()


def fused_moe(x, w13, w2, topk_weights, topk_ids):
    """Routed experts: sum_j topk_weights[t, j] * down(silu(gate x) * up x) of expert topk_ids[t, j].

    x: [T, H]; w13: dense [E, 2I, H] (gate rows first) or QuantizedWeight [E, H//8, 2I];
    w2: dense [E, H, I] or QuantizedWeight [E, I//8, H]. Returns [T, H] in x.dtype.
    """
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = x[tok].float() @ _expert_matrix(w13, e, torch.float32)
        h = silu_mul(h)
        y = h @ _expert_matrix(w2, e, torch.float32)
        out.index_add_(0, tok, y * topk_weights[tok, slot, None].float())
    return out.to(x.dtype)


# ---------------------------------------------------------------- sampling
_MASK32 = 0xFFFFFFFF


def _hash32(x):
    """lowbias32 integer hash on uint32 values held in int64 tensors."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def sampling_uniforms(seeds, steps, vocab_size: int):
    """Counter-based uniforms in (0, 1): [B, V] fp32, a pure function of (seed, step, token id), so a
    request samples the same tokens whatever batch it is in, and the Triton sampler reproduces them
    bit for bit. key = h(h(seed_lo ^ h(seed_hi + 0x9E3779B9)) ^ step); r = h(key + v * 0x9E3779B9);
    u = ((r >> 8) + 0.5) / 2^24."""
    seeds, steps = seeds.to(torch.int64), steps.to(torch.int64)
    key = _hash32((seeds & _MASK32) ^ _hash32(((seeds >> 32) & _MASK32) + 0x9E3779B9))
    key = _hash32(key ^ (steps & _MASK32))
    v = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    r = _hash32(key[:, None] + ((v * 0x9E3779B9) & _MASK32)[None, :])
    return ((r >> 8).to(torch.float32) + 0.5) / 16777216.0


def sample_tokens(logits, temperature, top_k, top_p, min_p, seeds, steps):
    """Sample one token per row with per-row parameters.

    logits: [B, V] fp32 (penalties and logit_bias already applied); temperature [B] fp32 (0 =
    greedy: argmax, first index on ties); top_k [B] int32 (<= 0 = off); top_p [B] fp32 (1 = off);
    min_p [B] fp32 (0 = off); seeds, steps [B] int64 select the random stream
    (:func:`sampling_uniforms`). Filters apply in that order on p = softmax(logits / T): top-k, then
    top-p (smallest set of most likely tokens whose mass reaches top_p), then min-p (p >= min_p *
    max p). Among kept tokens the sample is argmax(p / -log(u)), an exact draw from the
    renormalised distribution. Returns [B] int64.
    """
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    probs = (logits.float() / t[:, None]).softmax(-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=logits.device)[None, :]
    keep_sorted = (top_k[:, None] <= 0) | (rank < top_k[:, None])
    mass_before = sorted_p.cumsum(-1) - sorted_p
    keep_sorted &= mass_before < top_p[:, None]
    keep_sorted &= sorted_p >= min_p[:, None] * sorted_p[:, :1]
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    u = sampling_uniforms(seeds, steps, probs.shape[-1])
    score = torch.where(keep, probs / -torch.log(u), torch.full_like(probs, -1.0))
    sampled = score.argmax(-1)
    return torch.where(greedy, logits.argmax(-1), sampled)
