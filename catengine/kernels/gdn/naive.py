"""Torch twins of the Gated DeltaNet family: causal conv1d (varlen and decode), the gating, and the
gated delta rule in its chunked and recurrent forms; the oracle in tests and the engine's CPU path.

Each function has exactly the signature of the Triton implementation that replaces it on CUDA
(``catengine.kernels.ops`` picks one or the other); shapes use the letters of the package docstring
(:mod:`catengine.kernels`). Unless said otherwise, outputs have the dtype of the main input and math is
done in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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
    <= 0), beta: [T, Hv] fp32; ssm_states: [num_slots, Hv, dk, dv] fp32, fp16 or bf16 (loaded to fp32,
    rounded when stored), read from state_slots[b]
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


def chunk_output(q, k, vn, hb, g, kn, query_start_loc, scale: float, use_qk_l2norm: bool = True,
                 chunk_size: int = 64):
    """The split form's output stage alone (chunk_o.py, chunk_o_sm70.py): per chunk of each sequence,
    o = e^G (q S_c) + tril(q k^T * e^{G_i - G_j}) v_new with G the chunk's cumulative log decay.

    q, k: [T, Hk, dk]; vn (v_new): [T, Hv, dv]; hb: [chunks, Hv, dk, dv], the state at the start of each
    chunk in global chunk order (sequences in order, ceil(len / chunk_size) each); g: [T, Hv] log decay per
    token; kn: [T, Hv] the key norms 1 / |k| the WY stage wrote (k is scaled by them, not normalised here);
    q l2-normalised when ``use_qk_l2norm``, then scaled by ``scale``. Returns o: [T, Hv, dv] in vn.dtype.
    """
    rep = vn.shape[1] // q.shape[1]
    qf = q.float()
    if use_qk_l2norm:
        qf = _l2norm(qf)
    qf = (qf * scale).repeat_interleave(rep, 1)
    kf = k.float().repeat_interleave(rep, 1) * kn.float()[:, :, None]
    out = torch.empty_like(vn)
    qsl, c = query_start_loc.tolist(), 0
    for b in range(len(qsl) - 1):
        for c0 in range(qsl[b], qsl[b + 1], chunk_size):
            c1 = min(c0 + chunk_size, qsl[b + 1])
            qc, kc, vc = (x[c0:c1].transpose(0, 1) for x in (qf, kf, vn.float()))  # [Hv, n, *]
            gc = g[c0:c1].float().t().cumsum(-1)
            attn = (qc @ kc.transpose(1, 2)) * (gc[:, :, None] - gc[:, None, :]).exp().tril()
            o = (qc * gc.exp()[:, :, None]) @ hb[c].float() + attn @ vc
            out[c0:c1] = o.transpose(0, 1).to(vn.dtype)
            c += 1
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
            # rounded to the slot dtype after every token, as if stored and reloaded (no-op for fp32): several
            # tokens in one call equal as many one-token calls
            # tokens in one call equal as many one-token calls; the output reads the unrounded state
            S = S + kb[t][:, :, None] * delta[:, None, :]
            out[s0 + t] = (S * qb[t][:, :, None]).sum(1).to(v.dtype)
            S = S.to(ssm_states.dtype).float()
            if intermediate_state_slots is not None and int(intermediate_state_slots[b, t]) >= 0:
                ssm_states[int(intermediate_state_slots[b, t])] = S.to(ssm_states.dtype)
        ssm_states[slot] = S.to(ssm_states.dtype)
    return out


def chunk_wy(k, v, g, beta, query_start_loc, use_qk_l2norm: bool = True, chunk_size: int = 64):
    """The split form's WY stage alone (chunk_wy.gdn_chunk_wy_kernel): per chunk of each sequence, with G the
    chunk's cumulative log decay, n = 1 / |k| (1 without ``use_qk_l2norm``), A = strictly-lower
    beta_i (n_i k_i . n_j k_j) e^{G_i - G_j} and X = (I + A)^-1: w = X (beta n k e^G), u = X (beta v).

    k: [T, Hk, dk]; v: [T, Hv, dv]; g, beta: [T, Hv] fp32. Returns w [T, Hv, dk], u [T, Hv, dv] in v.dtype and
    the key norms n [T, Hv] fp32."""
    rep = v.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(rep, 1)
    kn = torch.rsqrt((kf * kf).sum(-1) + 1e-6) if use_qk_l2norm else torch.ones(kf.shape[:2], device=k.device)
    kf = kf * kn[:, :, None]
    w, u = torch.empty_like(kf, dtype=v.dtype), torch.empty_like(v)
    qsl = query_start_loc.tolist()
    for b in range(len(qsl) - 1):
        for c0 in range(qsl[b], qsl[b + 1], chunk_size):
            c1 = min(c0 + chunk_size, qsl[b + 1])
            n = c1 - c0
            kc, vc = kf[c0:c1].transpose(0, 1), v[c0:c1].float().transpose(0, 1)  # [Hv, n, *]
            gc = g[c0:c1].float().t().cumsum(-1)
            bc = beta[c0:c1].float().t()
            decay = (gc[:, :, None] - gc[:, None, :]).clamp_max(0).exp().tril(-1)
            a = torch.eye(n, device=k.device) + bc[:, :, None] * (kc @ kc.transpose(1, 2)) * decay
            rhs = torch.cat([kc * (bc * gc.exp())[:, :, None], vc * bc[:, :, None]], dim=-1)
            wu = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
            w[c0:c1] = wu[..., :kc.shape[-1]].transpose(0, 1).to(v.dtype)
            u[c0:c1] = wu[..., kc.shape[-1]:].transpose(0, 1).to(v.dtype)
    return w, u, kn


def gdn_gating_recurrent(q, k, v, A_log, a, dt_bias, b, ssm_states, query_start_loc, state_slots, has_initial_state,
                         scale: float, use_qk_l2norm: bool = True, intermediate_state_slots=None):
    """:func:`gdn_gating` then :func:`recurrent_gated_delta_rule` (the decode and verify step's form: on the GPU one
    launch computes the gating inside the recurrent kernel). a, b: [T, Hv] the gating's inputs; the rest as there."""
    g, beta = gdn_gating(A_log, a, dt_bias, b)
    return recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_slots, has_initial_state,
                                      scale, use_qk_l2norm, intermediate_state_slots)
